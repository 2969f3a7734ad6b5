"""Interleaved prefill's latency target: how much prompt fits in one engine step (Sarathi-Serve's budget, in time).

A step's time is the inter-token latency of every running stream: the decode call plus the step's prompt chunk
calls. From the graph latencies the runner measures at warm-up (runtime/latency.py) the scheduler estimates

    step = decode call (its rows, the bucket of the decodes' positions) + one one-row chunk call per prompt chunk
           (the bucket of the chunk's start; the tail graph for a last piece that fits it)

and plans chunk calls while the estimate stays within the target (interleave.plan_slices). The first chunk call of a
step always goes, so prompts progress whatever the target. The estimate bounds what runs from above: the runner
carries the decode inside a chunk (chunk_and_decode) and several prompts' chunks in one call where it can.

The target (ONP_PREFILL_TARGET_ITL_MS) defaults to a decode step of the full batch plus one chunk call, both at the
smallest bucket: a stream never waits more than about one chunk call for a prompt. A target below that default can
only be met with calls narrower than a chunk: with tail graphs (prefill_tail_size T) the plan then cuts a prompt into
pieces of T tokens where a whole chunk does not fit (`narrow`), each on the tail graph; more calls per prompt token,
shorter steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...config import NeuronConfig
from ...graphs import TOKEN_GENERATION
from ...runtime.graph_select import call_key, chunk_tokens
from ...runtime.latency import GraphLatencies


def measured_kind(nc: NeuronConfig, name: str, rows: int) -> bool:
    """The graphs the estimate reads: every token_generation graph, and the prompt chunk graphs of one row."""
    return name == TOKEN_GENERATION or (name == nc.prefill_graph and rows == 1)


@dataclass(frozen=True)
class StepTime:
    """One step's prefill allowance: `allowed` seconds of chunk calls, each costing chunk_seconds(start, left);
    `narrow`: the tokens of a piece narrower than a chunk the plan may cut where a whole chunk does not fit (0: none);
    `decoding`: whether the step also decodes running streams."""

    allowed: float
    model: StepTimeModel
    narrow: int = 0
    decoding: bool = True

    def chunk_seconds(self, start: int, left: int) -> float:
        return self.model.chunk_seconds(start, left)


class StepTimeModel:
    def __init__(self, nc: NeuronConfig, latencies: GraphLatencies, target: float | None) -> None:
        self.nc = nc
        self.seconds = latencies.seconds
        self.default = self.decode_seconds([0] * nc.batch_size) + self.chunk_seconds(0, nc.prefill_length)
        self.target = self.default if target is None else target
        self.below_default = self.target < self.default
        self.narrow = nc.prefill_tail_size if self.below_default else 0

    def decode_seconds(self, positions: Sequence[int]) -> float:
        """The decode call of requests feeding tokens at `positions` (0 when there are none)."""
        if not positions:
            return 0.0
        return self.seconds[call_key(self.nc, TOKEN_GENERATION, len(positions), [], positions)]

    def chunk_seconds(self, start: int, left: int) -> float:
        """The chunk call of a prompt at position `start` with `left` prompt tokens from there."""
        nc = self.nc
        tail = chunk_tokens(nc, left) < nc.prefill_length
        return self.seconds[call_key(nc, nc.prefill_graph, 1, [start], [start], tail)]

    def step(self, decode_positions: Sequence[int]) -> StepTime:
        allowed = self.target - self.decode_seconds(decode_positions)
        return StepTime(allowed, self, self.narrow, decoding=bool(decode_positions))
