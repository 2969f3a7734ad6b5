"""The step as data: one engine step's graph calls, in order, each naming its requests and its fallback.

plan_calls orders them (the one place the order is decided):

1. verify: the decoding requests that may speculate, when one of them has drafts (spec_decode/bookkeeping.py);
   falling back to the decode batch of those rows, every draft rejected (one token each).
2. the other decoding requests (token_generation), riding in the first prompt slice's chunk (chunk_and_decode) when
   the artifact fuses and the step's prompt slices are not prefilled together; falling back to the decode batch and
   the slice apart, so that a bad prompt fails alone.
3. the prompt slices: together (prefill_batch, falling back to one call per slice) when the artifact has prefill
   batch graphs and there is more than one slice, else one call each (the chunk loop).
4. the slices of requests asking for prompt logprobs, one call each on the prompt_logits graphs.

The runner runs the list in one guarded loop (runner/call_loop.py); a request that failed in a call is left out of the
calls after it, and a call kind whose calls keep failing runs as its fallback from then on (health.py). Each call's
tokens, logprobs and prefill figures go into a StepResult of its own, merged into the step's only when the call
succeeded. A step whose slices read blocks that other slices write this step (rows.py) repeats 3-4 per wave.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

from vllm.v1.outputs import LogprobsTensors

from ..sampling.host_sampling import TokenLogprobs
from .step_input import ScheduledSlice


class CallKind(enum.Enum):
    VERIFY = "verify"
    FUSED = "chunk_and_decode"
    DECODE = "token_generation"
    PREFILL = "prefill"  # one prompt slice (the chunk loop)
    PREFILL_TOGETHER = "prefill_batch"  # several prompt slices side by side
    PROMPT_LOGITS = "prompt_logits"


# What a call kind with a fallback runs as when it raises (logs).
FALLBACK_RUNS = {
    CallKind.VERIFY: "token_generation, every draft rejected (and, once retired, no drafts are proposed)",
    CallKind.FUSED: "token_generation and the prompt chunk in separate calls",
    CallKind.PREFILL_TOGETHER: "one prefill call per prompt",
}


@dataclass(frozen=True)
class GraphCall:
    kind: CallKind
    decodes: tuple[ScheduledSlice, ...] = ()  # decoding (or verifying) rows
    prefills: tuple[ScheduledSlice, ...] = ()  # prompt slices
    interleaved: bool = False  # the step that prefills these slices also decodes other requests (stats)
    fallback: tuple[GraphCall, ...] = ()  # run in its place when it raises; none: its requests fail

    @property
    def req_ids(self) -> list[str]:
        return [w.req_id for w in (*self.decodes, *self.prefills)]

    def without(self, failed: Collection[str]) -> GraphCall | None:
        """This call less the requests that failed earlier in the step; None when none is left."""
        if not failed or not set(self.req_ids) & set(failed):
            return self
        decodes = tuple(w for w in self.decodes if w.req_id not in failed)
        prefills = tuple(w for w in self.prefills if w.req_id not in failed)
        if not decodes and not prefills:
            return None
        kind, fallback = self.kind, tuple(c for c in (f.without(failed) for f in self.fallback) if c is not None)
        if kind is CallKind.FUSED and not (decodes and prefills):
            kind, fallback = (CallKind.DECODE if decodes else CallKind.PREFILL), ()
        if kind is CallKind.PREFILL_TOGETHER and len(prefills) == 1:
            kind, fallback = CallKind.PREFILL, ()
        return replace(self, kind=kind, decodes=decodes, prefills=prefills, fallback=fallback)

    def restarted(self, req_ids: Collection[str]) -> GraphCall:
        """This call with the prompt slices of req_ids starting at position 0 (the same end: the same sampling)."""
        prefills = tuple(
            replace(w, start=0, count=w.start + w.count) if w.req_id in req_ids else w for w in self.prefills
        )
        fallback = tuple(f.restarted(req_ids) for f in self.fallback)
        return replace(self, prefills=prefills, fallback=fallback)


def plan_calls(
    verifies: Sequence[ScheduledSlice],
    decodes: Sequence[ScheduledSlice],
    prefills: Sequence[ScheduledSlice],
    positions: Sequence[ScheduledSlice],
    fuses: bool,
    prefill_batch_size: int,
) -> list[GraphCall]:
    """The step's graph calls in order (module docstring). positions: slices of requests asking for prompt logprobs;
    fuses: the artifact has chunk_and_decode graphs."""
    calls: list[GraphCall] = []
    if verifies:
        # The decode keeps each row's drafts only to count them rejected (CallExecutor._decode).
        calls.append(
            GraphCall(CallKind.VERIFY, tuple(verifies), fallback=(GraphCall(CallKind.DECODE, tuple(verifies)),))
        )
    interleaved, decodes, prefills = bool(decodes), tuple(decodes), list(prefills)
    # A batched chunk saves ~25% of every prompt row's compute, a ride saves one decode call: batching wins.
    together = len(prefills) > 1 and prefill_batch_size > 1
    if decodes and prefills and fuses and not together:
        first = (prefills.pop(0),)
        apart = (GraphCall(CallKind.DECODE, decodes), GraphCall(CallKind.PREFILL, prefills=first, interleaved=True))
        calls.append(GraphCall(CallKind.FUSED, decodes, first, interleaved=True, fallback=apart))
    elif decodes:
        calls.append(GraphCall(CallKind.DECODE, decodes))
    alone = [GraphCall(CallKind.PREFILL, prefills=(w,), interleaved=interleaved) for w in prefills]
    if together:
        calls.append(GraphCall(CallKind.PREFILL_TOGETHER, prefills=tuple(prefills), interleaved=interleaved,
                               fallback=tuple(alone)))  # fmt: skip
    else:
        calls += alone
    calls += [GraphCall(CallKind.PROMPT_LOGITS, prefills=(w,), interleaved=interleaved) for w in positions]
    return calls


@dataclass(frozen=True)
class PrefillRecord:
    """A prompt slice's figures (RequestStats), added to its request when its call succeeds."""

    req_id: str
    seconds: float
    calls: int
    interleaved: bool
    batched: bool


@dataclass
class StepResult:
    """What a call (or the whole step) produced, by request."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, LogprobsTensors] = field(default_factory=dict)
    prefilled: list[PrefillRecord] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def merge(self, other: StepResult) -> None:
        self.tokens |= other.tokens
        self.logprobs |= other.logprobs
        self.prompt_logprobs |= other.prompt_logprobs
        self.prefilled += other.prefilled
        self.failed += other.failed
