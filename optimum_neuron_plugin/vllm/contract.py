"""The scheduler-runner contract: what the scheduler hands the runner with each step (vLLM's SchedulerOutput plus
the cache slot of each admitted request and the prefix copies), what the runner hands back (vLLM's ModelRunnerOutput
plus the requests whose graph call failed, those whose prefix copy was prefilled instead and, once, the graph
latencies), and the one test of a decoding request both sides apply."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from ..runtime.latency import GraphLatencies
from .compat import scheduler_output_fields
from .scheduler.prefix_cache import PrefixCopy


@dataclass
class NeuronRunnerOutput(ModelRunnerOutput):
    """vLLM's step output plus the requests whose graph call raised (they sampled nothing), the requests whose prefix
    copy raised and whose prefix was prefilled instead (no token of theirs came from the cache), and with the first
    step of an interleaved engine the graph latencies measured at warm-up (scheduler/step_budget.py)."""

    failed_req_ids: list[str] = field(default_factory=list)
    refilled_req_ids: list[str] = field(default_factory=list)
    graph_latencies: GraphLatencies | None = None


@dataclass
class NeuronSchedulerOutput(SchedulerOutput):
    """vLLM's step output plus the cache slot of every request admitted (new or resumed) this step, and the prefix
    copies the runner makes before the step's other graph calls, in claim order (prefix_cache.py)."""

    slots: dict[str, int] = field(default_factory=dict)
    copies: list[PrefixCopy] = field(default_factory=list)

    @classmethod
    def of(cls, output: SchedulerOutput, slots: dict[str, int], copies: list[PrefixCopy]) -> NeuronSchedulerOutput:
        return cls(**scheduler_output_fields(output), slots=slots, copies=copies)


def admitted_ids(output: SchedulerOutput) -> set[str]:
    """Requests admitted this step: new ones and ones resuming after preemption."""
    return {new.req_id for new in output.scheduled_new_reqs} | set(output.scheduled_cached_reqs.resumed_req_ids)


def is_decode(num_tokens: int, num_computed_tokens: int, num_output_tokens: int) -> bool:
    """The one test of a decoding request: its only token not yet computed is the last one it sampled (the scheduler
    gives it one token a step, plus drafts; the runner runs it in the decode batch)."""
    return num_output_tokens > 0 and num_tokens - num_computed_tokens == 1


def prompt_tokens_left(request: Request) -> int:
    """Tokens still to prefill; 0 for a decoding request (one sampled token to feed)."""
    if is_decode(request.num_tokens, request.num_computed_tokens, request.num_output_tokens):
        return 0
    return request.num_tokens - request.num_computed_tokens


def rejected_drafts(scheduler_output: SchedulerOutput, output: ModelRunnerOutput, req_id: str) -> int:
    """Draft tokens of req_id rejected this step: vLLM rolls num_computed_tokens back by them in update_from_output.
    Their K/V is in the slot (overwritten by the request's next call), so the prefix cache must not count them."""
    drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
    if not drafts:
        return 0
    sampled = output.sampled_token_ids[output.req_id_to_index[req_id]] if output.sampled_token_ids else []
    return len(drafts) - max(len(sampled) - 1, 0)
