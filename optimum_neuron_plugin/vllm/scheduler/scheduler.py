"""NeuronScheduler: vLLM's scheduler, plus failing the requests whose graph call raised.

vLLM's KV cache manager owns the KV blocks: admission, prefix caching (its hits, metrics, cached_tokens, KV events,
reset_prefix_cache) and preemption when blocks run out are vLLM's own; the runner writes each request's block ids
into the model's block tables (runner/rows.py).

Decision: a compiled graph call that raises (a Neuron runtime error, an artifact whose graph cannot
run some input, ...) fails the requests of that call, not the engine. The runner catches the
exception, logs it with the graph's file, and reports the requests in
NeuronRunnerOutput.failed_req_ids; this scheduler finishes them with FINISHED_ERROR, which vLLM's
OpenAI server answers with a 500 ("Internal server error"), and frees their blocks, after taking out of vLLM's prefix
cache the blocks the failed call was to write (vLLM hashes blocks when it allocates them). Every
other request keeps running and later requests are served. Without this, vLLM 0.32 treats any
worker exception as a dead engine: every in-flight request fails and `vllm serve` exits with status 0.

Interleaved prefill (prefill_mode=interleaved): before each step the scheduler plans which prompts
get which slice (interleave.py: whole chunks, as many chunk calls as fit the latency target (scheduler/step_budget.py, from the
graph latencies the runner measures at warm-up and reports with its first output) or a fixed number, shortest
remaining first with aging; vLLM's priority order under --scheduling-policy priority), then lets vLLM's own
schedule() run with two nudges: planned waiting requests move to the front of the FCFS queue (a priority queue
keeps its order, which the plan follows), and every prefilling request's slice is capped to its plan in
prefill_slice_size, the per-request hook vLLM 0.32 calls on the final slice size of running and
waiting requests alike (a 0 makes vLLM skip the request this step; compat.scheduler_with_hooks). vLLM keeps its
token budget, KV blocks, admission and bookkeeping; its token budget covers every decode plus the
plan (engine_config sets max_num_batched_tokens), so decodes are never cut.
"""

from __future__ import annotations

from dataclasses import replace

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import FCFSRequestQueue, SchedulingPolicy
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from ...artifact import load_neuron_config
from ...runtime.latency import GraphLatencies
from ..compat import free_blocks, held_blocks, prefix_cache_hit, scheduler_with_hooks, uncache_blocks_from
from ..contract import computed_tokens, is_decode, prompt_tokens_left, runs_as_decode_row
from ..engine.options import PrefillMode, prefill_chunk_budget, prefill_mode, prefill_target_itl
from ..log import get_logger
from .interleave import Candidate, InterleavePolicy, plan_slices
from .step_budget import StepTimeModel

logger = get_logger(__name__)


class NeuronScheduler(scheduler_with_hooks()):
    def __init__(self, vllm_config, *args, **kwargs) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        neuron_config = load_neuron_config(vllm_config.model_config.model)
        self.interleave: InterleavePolicy | None = None
        self.step_time: StepTimeModel | None = None  # latency target: set from the runner's first output
        if prefill_mode(vllm_config.additional_config) is PrefillMode.INTERLEAVED:
            self.neuron_config = neuron_config
            self._target_itl = prefill_target_itl(vllm_config.additional_config)
            self._fixed_budget = prefill_chunk_budget(vllm_config.additional_config)
            chunk = neuron_config.prefill_length
            self.interleave = InterleavePolicy(
                chunk=chunk,
                chunk_budget=self._fixed_budget or -(-self.max_num_scheduled_tokens // chunk),
                batch_chunks=neuron_config.prefill_batch_size,
                by_priority=vllm_config.scheduler_config.policy == SchedulingPolicy.PRIORITY.value,
            )
        self._passes: dict[str, int] = {}  # aging: prefilling steps that passed a request over
        self._slices: dict[str, int] | None = None  # this step's plan while super().schedule() runs

    # ---- interleaved prefill ------------------------------------------------------------------

    def schedule(self, *args, **kwargs) -> SchedulerOutput:
        if self.interleave is None:
            return super().schedule(*args, **kwargs)
        return self._schedule_interleaved(*args, **kwargs)

    def _schedule_interleaved(self, *args, **kwargs) -> SchedulerOutput:
        running = [r for r in self.running if prompt_tokens_left(r) > 0]
        waiting = self._admittable_waiting(running)
        candidates = [
            Candidate(
                r.request_id,
                left,
                r.num_tokens - left,
                self._passes.get(r.request_id, 0),
                r.arrival_time,
                r.priority,
                holds_kv=r.status == RequestStatus.WAITING and r.num_computed_tokens > 0,
                decode_row=left == 1 and self._feeds_last_token(r),
            )  # fmt: skip
            for r in running + waiting
            for left in [self._tokens_to_prefill(r)]
        ]
        decodes = [r.num_computed_tokens for r in self.running if prompt_tokens_left(r) == 0]
        policy, time = self.interleave, None
        if self.step_time is not None:  # the step's decode rows: the decodes and the prompts fed as one (rule 6)
            time = self.step_time.step(decodes + [c.start for c in candidates if c.decode_row])
        elif self._fixed_budget is None:  # the latency target before the runner's latencies arrive: one call
            policy = replace(policy, chunk_budget=1)
        plan = plan_slices(candidates, policy, self.max_num_scheduled_tokens - len(decodes), time)
        for queue in (self.kv_holding_waiting, self.waiting):
            self._move_to_front(queue, [r for r in queue if r.request_id in plan])
        self._slices = {c.req_id: plan.get(c.req_id, 0) for c in candidates}
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self._slices = None
        served = output.num_scheduled_tokens
        any_served = any(c.req_id in served for c in candidates)
        self._passes = {c.req_id: 0 if c.req_id in served else c.passes + int(any_served) for c in candidates}
        return output

    def _tokens_to_prefill(self, request: Request) -> int:
        """Prompt tokens left; for a request not yet admitted, after vLLM's prefix-cache hit it would get now."""
        if request.status == RequestStatus.RUNNING or request.num_computed_tokens:
            return prompt_tokens_left(request)
        return request.num_tokens - prefix_cache_hit(self, request)

    @staticmethod
    def _feeds_last_token(request: Request) -> bool:
        """A candidate whose one token left runs as a decode row (contract.runs_as_decode_row). The runner's count of
        its prefill calls is not here: a running prompt, or one preempted before its first output, had its slices
        prefilled by the runner."""
        prefilled = request.status == RequestStatus.RUNNING or (
            request.num_preemptions > 0 and not request.num_output_tokens
        )
        params = request.sampling_params
        logprobs = params is not None and params.prompt_logprobs is not None
        return runs_as_decode_row(
            request.num_tokens, request.num_tokens - 1, request.num_output_tokens, prefilled, logprobs
        )

    def _admittable_waiting(self, running: list[Request]) -> list[Request]:
        """Waiting requests that this step's free places (max_num_seqs) and free blocks could take, in the order vLLM's
        admission loop reaches them: its queue of requests holding KV (resumed streaming-input sessions) first, then
        the waiting queue; up to the first whose prompt does not fit, as vLLM's loop stops there.

        Decision: a request is admitted only if its whole prompt fits in the free blocks less those the prompts in
        flight (`running`, and the requests admitted before it) still need to finish. vLLM's own admission checks the
        whole prompt against the free blocks only (scheduler_reserve_full_isl); that suffices for its scheduler, which
        gives running prompts the token budget first, so a prompt rarely stays half prefilled. The plan here
        interleaves many prompts one chunk a step, shortest first: without the reservation it admitted prompts that the
        half-prefilled ones then took the blocks of, and the decodes' next blocks preempted the latest admitted, which
        the plan admitted again (38 preemptions against vLLM CPU's 6 on one pool: benchmark/results/
        20261203-block-pool-mixed-chat-preemptions). Once every running request was a half-prefilled prompt, a plan
        that gave the step's chunk to a waiting prompt vLLM could not admit served nobody, step after step."""
        limit = min(self.max_num_running_reqs, self.max_num_active_reqs)
        places = limit - len(self.running) - self.num_waiting_for_streaming_input
        ready = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        queued = [r for r in (*self.kv_holding_waiting, *self.waiting) if r.status in ready][: max(places, 0)]
        room = free_blocks(self) - sum(self._blocks_to_finish_prompt(r) for r in running)
        admitted = []
        for request in queued:
            room -= self._blocks_to_finish_prompt(request)
            if room < 0:
                break
            admitted.append(request)
        return admitted

    def _blocks_to_finish_prompt(self, request: Request) -> int:
        """Blocks the request must still take to hold its prompt (and, resumed, its outputs so far). A waiting
        request's prefix-cache hit counts as needed: vLLM's own check counts the hit blocks no running request holds,
        and a plan that chose a request vLLM then refuses would serve nobody that step."""
        return -(-request.num_tokens // self.block_size) - held_blocks(self, request.request_id)

    @staticmethod
    def _move_to_front(queue, requests: list[Request]) -> None:
        """vLLM admits waiting requests in queue order and stops at the first it cannot schedule. A priority queue
        keeps its own order: under the priority policy the plan takes requests in that order (interleave.py)."""
        if requests and isinstance(queue, FCFSRequestQueue):
            queue.remove_requests(requests)
            queue.prepend_requests(reversed(requests))

    def prefill_slice_size(self, request: Request, num_computed_tokens: int, num_new_tokens: int) -> int:
        if self._slices is None:
            return num_new_tokens  # serial mode
        if is_decode(request.num_tokens, num_computed_tokens, request.num_output_tokens):
            return num_new_tokens
        # A prefill the plan did not choose (e.g. a request that became ready during this step) waits.
        return min(num_new_tokens, self._slices.get(request.request_id, 0))

    def _use_latencies(self, latencies: GraphLatencies) -> None:
        self.step_time = StepTimeModel(self.neuron_config, latencies, self._target_itl)
        model = self.step_time
        logger.info(
            "interleaved prefill: steps fit a target of %.0f ms (%s; a decode of %d rows %.0f ms, a chunk call %.0f "
            "ms, at the smallest bucket)",
            model.target * 1000, "ONP_PREFILL_TARGET_ITL_MS" if self._target_itl else "default: a decode plus a chunk",
            self.neuron_config.batch_size, model.decode_seconds([0] * self.neuron_config.batch_size) * 1000,
            model.chunk_seconds(0, self.neuron_config.prefill_length) * 1000,
        )  # fmt: skip
        if not model.below_default:
            return
        if model.narrow:
            logger.info(
                "interleaved prefill: the target is below a decode plus a chunk call (%.0f ms): where a whole chunk "
                "does not fit, a step prefills a %d-token piece on the tail graph", model.default * 1000, model.narrow,
            )  # fmt: skip
            return
        logger.warning(
            "interleaved prefill: ONP_PREFILL_TARGET_ITL_MS %.0f ms is below a decode plus a chunk call (%.0f ms) and "
            "this export has no tail graphs, so each step still runs one whole chunk call: export with "
            "--prefill-tail-size to let the target cut prompts into smaller pieces", model.target * 1000,
            model.default * 1000,
        )  # fmt: skip

    # ---- failures -----------------------------------------------------------------------------

    def _forget_failed_blocks(self, scheduler_output: SchedulerOutput, failed: list[str]) -> None:
        """vLLM hashes a request's full blocks when it allocates them, before the step writes them: the blocks a failed
        call was to write from its request's first position this step hold nothing valid, so they leave vLLM's prefix
        cache (a BlockRemoved event each) before vLLM frees the request. Blocks before that position were written
        by earlier steps, or are hits of other requests, and stay."""
        starts = computed_tokens(scheduler_output)
        for req_id in failed:
            if req_id in self.requests and req_id in starts:
                uncache_blocks_from(self, req_id, starts[req_id])

    def update_from_output(self, scheduler_output, model_runner_output: ModelRunnerOutput):
        failed = getattr(model_runner_output, "failed_req_ids", None)
        latencies = getattr(model_runner_output, "graph_latencies", None)
        if latencies is not None and self.interleave is not None and self._fixed_budget is None:
            self._use_latencies(latencies)
        if failed:
            self._forget_failed_blocks(scheduler_output, failed)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if failed:
            for request in self.finish_requests(failed, RequestStatus.FINISHED_ERROR):
                error = EngineCoreOutput(
                    request_id=request.request_id, new_token_ids=[], finish_reason=request.get_finished_reason()
                )
                client = outputs.setdefault(request.client_index, EngineCoreOutputs(outputs=[]))
                client.outputs.append(error)
        return outputs
