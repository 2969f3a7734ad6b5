"""Graph latencies measured on the serving host: what each compiled graph call costs, for step planning.

The interleaved scheduler fits a step's prompt chunks into a latency target (vllm/scheduler/step_budget.py) from these figures.
Each graph is timed on its example inputs (slot 0, rewritten by the next request that uses it) after warm-up, the
fastest of `repeats` calls: the first call of a graph pays one-time costs (program load, the CPU backend's profiling
run) that no step pays.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..graphs import GraphSpec, example_inputs
from .graph_select import GraphKey, spec_key


@dataclass(frozen=True)
class GraphLatencies:
    """Seconds of one call per graph (graph_select.GraphKey)."""

    seconds: dict[GraphKey, float] = field(default_factory=dict)

    def of(self, spec: GraphSpec) -> float:
        return self.seconds[spec_key(spec)]


def measure(call: Callable[..., object], specs: Iterable[GraphSpec], repeats: int = 3) -> GraphLatencies:
    """The fastest of `repeats` calls of each graph in `specs` on its example inputs; `call(spec, *inputs)` runs one
    (on every tensor-parallel rank alike: the graphs' collectives need all ranks in the same order)."""
    seconds = {}
    for spec in specs:
        inputs = example_inputs(spec)
        best = float("inf")
        for _ in range(repeats):
            began = time.perf_counter()
            call(spec, *inputs)
            best = min(best, time.perf_counter() - began)
        seconds[spec_key(spec)] = best
    return GraphLatencies(seconds)
