"""The one loop that runs a step's graph calls (runner/call_plan.py): failure isolation, health and generator state.

For each call, less the requests that failed earlier in the step:
- the generators of its requests are saved, and the call runs into a StepResult of its own (runner/call_executor.py);
- when it succeeds, health's count of failed calls in a row resets, and its result is committed (tokens appended to
  the requests, prefill figures added) and merged into the step's;
- when it raises, its requests' generators are restored and its result dropped, so nothing of the failed call
  remains: a seeded request run again draws what it would have drawn. A call with a fallback then runs the fallback's
  calls in its place; any other fails its requests (NeuronScheduler finishes them with an error), and too many
  failed calls in a row stop the engine (health.py).
- a call kind with a fallback that failed RETIRE_AFTER times in a row is retired (health.py): its calls run as their
  fallback without trying its graph.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from ..log import get_logger
from .call_executor import CallExecutor
from .call_plan import FALLBACK_RUNS, CallKind, GraphCall, StepResult
from .health import RETIRE_AFTER, GraphHealth, RetiredGraph
from .request_state import RequestState

logger = get_logger(__name__)


class GuardedCalls:
    def __init__(
        self, executor: CallExecutor, requests: dict[str, RequestState], health: GraphHealth,
        graph_files: Callable[[str], str],
    ) -> None:  # fmt: skip
        self.executor = executor
        self.requests = requests
        self.health = health
        self.graph_files = graph_files  # graph name -> its files, for the log

    def run(self, calls: Sequence[GraphCall], producers: Mapping[str, Collection[str]] | None = None) -> StepResult:
        """producers: req_id -> the requests whose writes this step its slice reads (rows.py)."""
        step, pending = StepResult(), list(calls)
        while pending:
            call = pending.pop(0).without(step.failed)
            if call is None:
                continue
            call = self._restart_orphans(call, step.failed, producers or {})
            if call.fallback and self.retired(call.kind):
                pending[:0] = call.fallback
                continue
            saved, calls_before = self._generator_states(call.req_ids), self.executor.graph_calls(call)
            try:
                result = self.executor.run(call)
            except Exception as error:  # noqa: BLE001 - any graph failure fails its requests only (scheduler.py)
                self._restore(saved)
                if call.fallback:
                    self._fell_back(call, error)
                    pending[:0] = call.fallback
                else:
                    step.failed += self._failed(call, error)
                continue
            ran_its_graph = self.executor.graph_calls(call) > calls_before
            self.health.succeeded(call.kind.value if ran_its_graph else None)
            self._commit(result)
            step.merge(result)
        return step

    @staticmethod
    def _restart_orphans(call: GraphCall, failed: list[str], producers: Mapping[str, Collection[str]]) -> GraphCall:
        """A slice whose first blocks a failed call of the step was to write is prefilled from position 0: it writes
        them itself (a hit's blocks hold its own first tokens), at the cost of their compute."""
        orphans = {r for r in call.req_ids if set(producers.get(r, ())) & set(failed)}
        if not orphans:
            return call
        logger.warning(
            "request(s) %s share KV blocks that a failed graph call was to write: prefilled from position 0",
            ", ".join(sorted(orphans)),
        )
        return call.restarted(orphans)

    def retired(self, kind: CallKind) -> bool:
        """The kind's calls run as their fallback for the life of the server (health.py)."""
        return kind.value in self.health.retired

    def _fell_back(self, call: GraphCall, error: Exception) -> None:
        graph = self.executor.graph(call)
        if not self.health.fell_back(call.kind.value):
            logger.warning(
                "graph %s raised %s: %s; running its requests in %d separate calls",
                graph, type(error).__name__, error, len(call.fallback),
            )  # fmt: skip
            return
        retired = RetiredGraph(graph, self.graph_files(graph), FALLBACK_RUNS[call.kind])
        self.health.retire(call.kind.value, retired)
        logger.warning(
            "graph %s (%s) raised in %d %s calls in a row (the last: %s: %s): the server stops calling it and runs "
            "%s instead",
            graph, retired.files, RETIRE_AFTER, call.kind.value, type(error).__name__, error, retired.instead,
        )  # fmt: skip

    def _generator_states(self, req_ids: list[str]) -> list[tuple]:
        generators = [self.requests[r].generator for r in req_ids]
        return [(g, g.get_state()) for g in generators if g is not None]

    @staticmethod
    def _restore(saved: list[tuple]) -> None:
        for generator, state in saved:
            generator.set_state(state)

    def _commit(self, result: StepResult) -> None:
        for req_id, tokens in result.tokens.items():
            self.requests[req_id].output_token_ids.extend(tokens)
        for record in result.prefilled:
            stats = self.requests[record.req_id].stats
            stats.prefill_seconds += record.seconds
            stats.prefill_calls += record.calls
            stats.prefill_steps += 1
            stats.interleaved |= record.interleaved
            stats.batched |= record.batched

    def _failed(self, call: GraphCall, error: Exception) -> list[str]:
        """The requests of a call that raised, logged with the graph's files; raises EngineStopError when too many
        calls failed in a row (health.py)."""
        stop = self.health.failed()
        graph = self.executor.graph(call)
        logger.error(
            "graph %s (%s) raised %s: %s; failing request(s) %s%s",
            graph, self.graph_files(graph), type(error).__name__, error, ", ".join(call.req_ids),
            "" if stop else ", the server keeps serving",
            exc_info=error,
        )  # fmt: skip
        if stop:
            raise self.health.stop_error(graph, error) from error
        return call.req_ids
