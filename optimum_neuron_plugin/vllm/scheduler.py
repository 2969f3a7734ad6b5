"""NeuronScheduler: vLLM's scheduler, plus failing the requests whose graph call raised.

Decision: a compiled graph call that raises (a Neuron runtime error, an artifact whose graph cannot
run some input, ...) fails the requests of that call, not the engine. The runner catches the
exception, logs it with the graph's file, and reports the requests in
NeuronRunnerOutput.failed_req_ids; this scheduler finishes them with FINISHED_ERROR, which vLLM's
OpenAI server answers with a 500 ("Internal server error"), and frees their cache slots. Every
other request keeps running and later requests are served. Without this, vLLM 0.32 treats any
worker exception as a dead engine: every in-flight request fails and `vllm serve` exits with status 0.

Interleaved prefill (prefill_mode=interleaved): before each step the scheduler plans which prompts
get which slice (interleave.py: whole chunks, a budget in chunk calls, shortest remaining first
with aging), then lets vLLM's own schedule() run with two nudges: planned waiting requests move
to the front of the FCFS queue, and every prefilling request's slice is capped to its plan in
_reserve_prefill_lookahead, the per-request hook vLLM 0.32 calls on the final slice size of
running and waiting requests alike (a 0 makes vLLM skip the request this step). vLLM keeps its
token budget, KV blocks, admission and bookkeeping; its token budget covers every decode plus the
plan (engine_config sets max_num_batched_tokens), so decodes are never cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from .engine_config import load_neuron_config
from .interleave import Candidate, InterleavePolicy, plan_slices
from .options import PrefillMode, prefill_chunk_budget, prefill_mode


@dataclass
class NeuronRunnerOutput(ModelRunnerOutput):
    """vLLM's step output plus the requests whose graph call raised (they sampled nothing)."""

    failed_req_ids: list[str] = field(default_factory=list)


def prompt_tokens_left(request: Request) -> int:
    """Tokens still to prefill; 0 for a decoding request (one sampled token to feed)."""
    left = request.num_tokens - request.num_computed_tokens
    return 0 if left == 1 and request.num_output_tokens > 0 else left


class NeuronScheduler(Scheduler):
    def __init__(self, vllm_config, *args, **kwargs) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        self.interleave: InterleavePolicy | None = None
        if prefill_mode(vllm_config.additional_config) is PrefillMode.INTERLEAVED:
            neuron_config = load_neuron_config(vllm_config.model_config.model)
            self.interleave = InterleavePolicy(
                chunk=neuron_config.prefill_length, chunk_budget=prefill_chunk_budget(vllm_config.additional_config)
            )
        self._passes: dict[str, int] = {}  # aging: prefilling steps that passed a request over
        self._slices: dict[str, int] | None = None  # this step's plan while super().schedule() runs

    # ---- interleaved prefill ------------------------------------------------------------------

    def schedule(self, *args, **kwargs) -> SchedulerOutput:
        if self.interleave is None:
            return super().schedule(*args, **kwargs)
        running = [r for r in self.running if prompt_tokens_left(r) > 0]
        waiting = self._admittable_waiting()
        candidates = [
            Candidate(r.request_id, prompt_tokens_left(r), self._passes.get(r.request_id, 0), r.arrival_time)
            for r in running + waiting
        ]
        decodes = len(self.running) - len(running)
        plan = plan_slices(candidates, self.interleave, self.max_num_scheduled_tokens - decodes)
        self._move_to_front([r for r in waiting if r.request_id in plan])
        self._slices = {c.req_id: plan.get(c.req_id, 0) for c in candidates}
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self._slices = None
        served = output.num_scheduled_tokens
        any_served = any(c.req_id in served for c in candidates)
        self._passes = {c.req_id: 0 if c.req_id in served else c.passes + int(any_served) for c in candidates}
        return output

    def _admittable_waiting(self) -> list[Request]:
        """Waiting requests, in queue order, that this step's free slots could take."""
        limit = min(self.max_num_running_reqs, self.max_num_active_reqs)
        free = limit - len(self.running) - self.num_waiting_for_streaming_input
        ready = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        return [r for r in self.waiting if r.status in ready][: max(free, 0)]

    def _move_to_front(self, requests: list[Request]) -> None:
        """vLLM admits waiting requests in queue order and stops at the first it cannot schedule."""
        if requests and isinstance(self.waiting, FCFSRequestQueue):
            self.waiting.remove_requests(requests)
            self.waiting.prepend_requests(reversed(requests))

    def _reserve_prefill_lookahead(self, request: Request, num_computed_tokens: int, num_new_tokens: int) -> int:
        num_new_tokens = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        if self._slices is None:
            return num_new_tokens  # serial mode
        if request.num_tokens - num_computed_tokens == 1 and request.num_output_tokens > 0:
            return num_new_tokens  # a decode
        # A prefill the plan did not choose (e.g. a request that became ready during this step) waits.
        return min(num_new_tokens, self._slices.get(request.request_id, 0))

    # ---- failures -----------------------------------------------------------------------------

    def update_from_output(self, scheduler_output, model_runner_output: ModelRunnerOutput):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        failed = getattr(model_runner_output, "failed_req_ids", None)
        if failed:
            for request in self.finish_requests(failed, RequestStatus.FINISHED_ERROR):
                error = EngineCoreOutput(
                    request_id=request.request_id, new_token_ids=[], finish_reason=request.get_finished_reason()
                )
                client = outputs.setdefault(request.client_index, EngineCoreOutputs(outputs=[]))
                client.outputs.append(error)
        return outputs
