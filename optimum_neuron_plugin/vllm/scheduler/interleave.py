"""Interleaved prefill: which prompts get which slice in one engine step (pure policy, no vLLM).

Rules (prefill_mode=interleaved; NeuronScheduler applies the plan through vLLM's scheduler):
1. A slice is a whole number of compiled chunks, except the last slice of a prompt, and n tokens
   to prefill cost ceil(n / chunk) graph calls, as in serial mode (the runtime pads only a
   prompt's last chunk). Under a latency target below a decode plus a chunk call (scheduler/step_budget.py,
   `narrow`), a slice may end with a piece of the tail graph's tokens where a whole chunk does
   not fit: the runtime runs the slice's whole chunks, then that piece on the tail graph.
2. The step's prefill budget is counted in graph calls, not tokens: the calls that fit the latency target
   (scheduler/step_budget.py: the measured seconds of each call against the target minus the step's decode; the first call
   always goes), or a fixed `chunk_budget`. Decodes are outside it: every decoding request gets its token each step.
3. Shortest remaining prompt first, so a short prompt overtakes a long one in progress. Aging: a
   prompt passed over in `max_passes` steps that prefilled others goes first (most passed first,
   then arrival order). Under `--scheduling-policy priority` (`by_priority`) the order is vLLM's instead: lowest
   priority value first, then arrival, then request id (vLLM's Request order), so the requests the plan admits are
   the first of vLLM's priority queue, the ones its admission loop reaches before it stops.
5. A resumed streaming-input session holding its KV blocks (`holds_kv`) goes before every other prompt: vLLM
   admits such requests (its queue of requests holding KV) before any other waiting request, and stops at the first
   it cannot schedule.
4. A lone prompt: when nothing decodes and no other prompt waits, the target has no stream's gap and no prompt's
   wait to bound. The step runs what one prefill batch call holds (`batch_chunks`, the export's prefill_batch_size)
   of the prompt's chunks, as the serial mode's chunk loop would call them: a long prompt alone costs serial's calls.
6. A prompt whose every token but the last is in its blocks when it is admitted (a prefix-cache hit, or a KV
   connector's load: the decode side of P/D) runs that token as a decode row, not a prefill call
   (contract.py `runs_as_decode_row`): it gets its token every step, outside the call budget, like a decode.

The bound: with at most B prompts competing (B = max_num_seqs: candidates are running prompts
plus the waiting ones that free places can take), a prompt is passed over at most
max_passes + B - 1 prefilling steps in a row. Once passed over max_passes times it is aged; only
prompts passed over at least as often (at most B - 1) go before it, every prefilling step serves
the first of them, and a served prompt restarts from 0 passes, below it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .step_budget import StepTime

DEFAULT_MAX_PASSES = 4


@dataclass(frozen=True)
class InterleavePolicy:
    chunk: int  # tokens per compiled prefill call (neuron_config.prefill_length)
    chunk_budget: int  # prefill graph calls per engine step at most (the fixed budget, or the token budget's room)
    max_passes: int = DEFAULT_MAX_PASSES  # aging: steps a prompt may be passed over before it goes first
    batch_chunks: int = 1  # a lone prompt's chunks per step (rule 4): the chunks one prefill batch call holds
    by_priority: bool = False  # vLLM's priority order instead of shortest first (rule 3)


@dataclass(frozen=True)
class Candidate:
    """A request with prompt tokens left to prefill."""

    req_id: str
    remaining: int  # prompt tokens not yet prefilled
    start: int  # the position of the first of them
    passes: int  # consecutive prefilling steps that passed this request over
    arrival: float  # FCFS tie-break
    priority: int = 0  # vLLM's request priority (lower first), read under the priority policy
    holds_kv: bool = False  # a resumed session holding its KV blocks: planned first (rule 5)
    decode_row: bool = False  # one token left after a full hit: a decode row, outside the call budget (rule 6)


def order(candidate: Candidate, policy: InterleavePolicy) -> tuple:
    first = 0 if candidate.holds_kv else 1
    if policy.by_priority:
        return (first, 0, candidate.priority, candidate.arrival, candidate.req_id)
    if candidate.passes >= policy.max_passes:
        return (first, 0, -candidate.passes, candidate.arrival)
    return (first, 1, candidate.remaining, candidate.arrival)


def plan_slices(
    candidates: list[Candidate], policy: InterleavePolicy, token_budget: int, time: StepTime | None = None
) -> dict[str, int]:
    """Prompt tokens to prefill this step per request (only requests that get a slice).

    token_budget: vLLM's token budget left for prefills once every decode has its token. time: the latency target's
    allowance (None: policy.chunk_budget calls).
    """
    chunk = policy.chunk
    rows = [c for c in candidates if c.decode_row][: max(token_budget, 0)]
    plan: dict[str, int] = {c.req_id: 1 for c in rows}  # rule 6
    prompts = [c for c in candidates if not c.decode_row]
    calls_left, tokens_left = policy.chunk_budget, token_budget - len(rows)
    if time is not None and not time.decoding and len(prompts) == 1:  # rule 4
        time, calls_left = None, min(calls_left, policy.batch_chunks)
    seconds_left = float("inf") if time is None else time.allowed
    for candidate in sorted(prompts, key=lambda c: order(c, policy)):
        tokens = 0
        while tokens < candidate.remaining and calls_left > 0:
            left = candidate.remaining - tokens
            piece = min(chunk, left)
            cost = 0.0 if time is None else time.chunk_seconds(candidate.start + tokens, left)
            narrow = time is not None and cost > seconds_left and 0 < time.narrow < left
            if narrow:  # the slice's last piece: the runtime runs whole chunks, then a rest that fits on the tail
                piece, cost = time.narrow, time.chunk_seconds(candidate.start + tokens, time.narrow)
            first = len(plan) == len(rows) and not tokens  # the step's first call always goes
            # An explicit, small max_num_batched_tokens: whole chunks only.
            if piece > tokens_left or (cost > seconds_left and not first):
                calls_left = 0
                break
            tokens += piece
            tokens_left -= piece
            seconds_left -= cost
            calls_left -= 1
            if narrow:
                break
        if tokens:
            plan[candidate.req_id] = tokens
        if calls_left == 0:
            break
    return plan
