"""When the engine stops: too many graph calls failing in a row, or an error outside any graph call; and which
graphs the runner stopped calling because they kept failing.

Decision: a graph call that raises fails only its requests (scheduler.py), but a device that fails
every call would then answer every request with a 500 while /health stays 200, so no supervisor
would ever replace it. After `ONP_MAX_GRAPH_FAILURES` consecutive failed graph calls (default 16;
any successful call resets the count) the runner raises EngineStopError out of the worker.

What makes /health fail in vLLM 0.32: UniProcExecutor.check_health never calls the worker, so a
worker check_health cannot. An exception out of execute_model reaches EngineCore's busy loop, which
logs "EngineCore encountered a fatal error", reports the engine dead to the front end (its /health
then answers 503, every in-flight request fails) and exits; the API server's watchdog then shuts
the server down, so `vllm serve` exits and a supervisor can restart it.

Errors outside the guarded graph calls (a request missing in update_states, a step the runner cannot
plan) mean the plugin and vLLM disagree about the engine's
state: the worker logs one line naming the cause (`fatal`) and lets the exception stop the engine.

Decision: a call with a fallback (runner/call_plan.py) that raises costs its requests nothing, but a graph that
always raises would cost its call, its fallback and a warning in every step. After RETIRE_AFTER failures in a row of
one call kind with a fallback (a success of that kind that ran its graph resets its count) the runner retires it: its calls run as
their fallback for the life of the server, one warning names the graph, its files and what runs instead, and
`GraphHealth.retired` lists it. The server keeps answering correctly, so /health stays 200.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..log import get_logger

MAX_GRAPH_FAILURES_ENV = "ONP_MAX_GRAPH_FAILURES"
DEFAULT_MAX_GRAPH_FAILURES = 16
RETIRE_AFTER = 3  # failed calls in a row of a call kind with a fallback

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


@dataclass(frozen=True)
class RetiredGraph:
    """A call kind the runner no longer runs: its graph, the graph's files, what its calls run as instead."""

    graph: str
    files: str
    instead: str


class GraphHealth:
    """Counts consecutive failed graph calls (the limit-th raises EngineStopError), and per call kind with a fallback
    its consecutive failures (the RETIRE_AFTER-th retires it)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = max_graph_failures() if limit is None else limit
        self.consecutive_failures = 0
        self.fallback_failures: dict[str, int] = {}  # call kind -> its failed calls in a row
        self.retired: dict[str, RetiredGraph] = {}  # call kind -> what runs instead, for the life of the server

    def succeeded(self, kind: str | None) -> None:
        """A call succeeded; kind: its call kind when its graph ran (a fused call run as its two calls is not one)."""
        self.consecutive_failures = 0
        if kind is not None:
            self.fallback_failures.pop(kind, None)

    def fell_back(self, kind: str) -> bool:
        """Count a failed call of a kind with a fallback; True when the kind must be retired (then retire it)."""
        self.fallback_failures[kind] = self.fallback_failures.get(kind, 0) + 1
        return self.fallback_failures[kind] >= RETIRE_AFTER

    def retire(self, kind: str, retired: RetiredGraph) -> None:
        self.retired[kind] = retired
        self.fallback_failures.pop(kind, None)

    def failed(self) -> bool:
        """Count a failed call; True when the engine must stop (then raise stop_error)."""
        self.consecutive_failures += 1
        return self.consecutive_failures >= self.limit

    def stop_error(self, graph: str, error: Exception) -> EngineStopError:
        return EngineStopError(
            f"{self.consecutive_failures} graph calls failed in a row (the last: {graph} raised "
            f"{type(error).__name__}: {error}); the device looks unusable, so the engine stops and /health "
            f"fails for a supervisor to restart the server ({MAX_GRAPH_FAILURES_ENV}={self.limit}){self._retired_note()}"
        )

    def _retired_note(self) -> str:
        if not self.retired:
            return ""
        return "; graphs retired earlier: " + ", ".join(f"{r.graph} (runs {r.instead})" for r in self.retired.values())


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
