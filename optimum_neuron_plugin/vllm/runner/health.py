"""When the engine stops: too many graph calls failing in a row, or an error outside any graph call.

Decision: a graph call that raises fails only its requests (scheduler.py), but a device that fails
every call would then answer every request with a 500 while /health stays 200, so no supervisor
would ever replace it. After `ONP_MAX_GRAPH_FAILURES` consecutive failed graph calls (default 16;
any successful call resets the count) the runner raises EngineStopError out of the worker.

What makes /health fail in vLLM 0.32: UniProcExecutor.check_health never calls the worker, so a
worker check_health cannot. An exception out of execute_model reaches EngineCore's busy loop, which
logs "EngineCore encountered a fatal error", reports the engine dead to the front end (its /health
then answers 503, every in-flight request fails) and exits; the API server's watchdog then shuts
the server down, so `vllm serve` exits and a supervisor can restart it.

Errors outside the guarded graph calls (a slot missing in update_states, a step the runner cannot
plan) mean the plugin and vLLM disagree about the engine's
state: the worker logs one line naming the cause (`fatal`) and lets the exception stop the engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from ..log import get_logger

MAX_GRAPH_FAILURES_ENV = "ONP_MAX_GRAPH_FAILURES"
DEFAULT_MAX_GRAPH_FAILURES = 16

logger = get_logger(__name__)


class EngineStopError(RuntimeError):
    """The engine must stop (vLLM then reports it dead and the server exits)."""


def max_graph_failures() -> int:
    value = os.environ.get(MAX_GRAPH_FAILURES_ENV, "").strip()
    if not value:
        return DEFAULT_MAX_GRAPH_FAILURES
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{MAX_GRAPH_FAILURES_ENV}={value!r} is not allowed: set it to a count >= 1, or unset it")
    return int(value)


class GraphHealth:
    """Counts consecutive failed graph calls; the limit-th raises EngineStopError."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = max_graph_failures() if limit is None else limit
        self.consecutive_failures = 0

    def succeeded(self) -> None:
        self.consecutive_failures = 0

    def failed(self) -> bool:
        """Count a failed call; True when the engine must stop (then raise stop_error)."""
        self.consecutive_failures += 1
        return self.consecutive_failures >= self.limit

    def stop_error(self, graph: str, error: Exception) -> EngineStopError:
        return EngineStopError(
            f"{self.consecutive_failures} graph calls failed in a row (the last: {graph} raised "
            f"{type(error).__name__}: {error}); the device looks unusable, so the engine stops and /health "
            f"fails for a supervisor to restart the server ({MAX_GRAPH_FAILURES_ENV}={self.limit})"
        )


@contextmanager
def fatal(where: str) -> Iterator[None]:
    """Log one line naming the cause of an exception that is about to stop the engine, then re-raise it."""
    try:
        yield
    except Exception as error:
        logger.error(
            "the Neuron plugin stops the engine: %s raised %s: %s", where, type(error).__name__, error or "(no message)"
        )
        raise
