"""The scheduler-runner contract: the scheduler hands the runner vLLM's SchedulerOutput (each request's KV block ids
included), the runner hands back vLLM's ModelRunnerOutput plus the requests whose graph call failed and, once, the
graph latencies; and the tests of a step's requests both sides apply."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from ..runtime.latency import GraphLatencies


@dataclass
class NeuronRunnerOutput(ModelRunnerOutput):
    """vLLM's step output plus the requests whose graph call raised (they sampled nothing), and with the first step of
    an interleaved engine the graph latencies measured at warm-up (scheduler/step_budget.py)."""

    failed_req_ids: list[str] = field(default_factory=list)
    graph_latencies: GraphLatencies | None = None


def computed_tokens(scheduler_output: SchedulerOutput) -> dict[str, int]:
    """req_id -> position where this step's tokens start (vLLM's num_computed_tokens), for every scheduled request."""
    starts = {new.req_id: new.num_computed_tokens for new in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    return starts


def is_decode(num_tokens: int, num_computed_tokens: int, num_output_tokens: int) -> bool:
    """The one test of a decoding request: its only token not yet computed is the last one it sampled (the scheduler
    gives it one token a step, plus drafts; the runner runs it in the decode batch)."""
    return num_output_tokens > 0 and num_tokens - num_computed_tokens == 1


def runs_as_decode_row(
    num_tokens: int, start: int, num_output_tokens: int, prefilled: bool, prompt_logprobs: bool
) -> bool:
    """Whether the one token at `start` runs as a decode row (token_generation, sampled like any decode): a decoding
    request's, or a prompt's last when every other token was in its blocks at admission (a KV connector loaded them,
    or a prefix-cache hit). Not a prompt this runner prefilled part of (`prefilled`: its last slice stays a prefill
    call, as in serial mode), nor one asking for prompt logprobs (the prompt_logits graph computes them). The runner
    runs the token so; the interleaved plan counts it so (outside its chunk-call budget)."""
    if is_decode(num_tokens, start, num_output_tokens):
        return True
    return 0 < start == num_tokens - 1 and not prefilled and not prompt_logprobs


def prompt_tokens_left(request: Request) -> int:
    """Tokens still to prefill; 0 for a decoding request (one sampled token to feed)."""
    if is_decode(request.num_tokens, request.num_computed_tokens, request.num_output_tokens):
        return 0
    return request.num_tokens - request.num_computed_tokens
