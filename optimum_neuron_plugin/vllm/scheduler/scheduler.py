"""NeuronScheduler: vLLM's scheduler, plus failing the requests whose graph call raised.

A prefix copy that raises (prefix caching) costs its request nothing: the runner prefills the prefix in its slot
instead, and the scheduler reports no cached token for it (_report_refilled).

Decision: a compiled graph call that raises (a Neuron runtime error, an artifact whose graph cannot
run some input, ...) fails the requests of that call, not the engine. The runner catches the
exception, logs it with the graph's file, and reports the requests in
NeuronRunnerOutput.failed_req_ids; this scheduler finishes them with FINISHED_ERROR, which vLLM's
OpenAI server answers with a 500 ("Internal server error"), and frees their cache slots. Every
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
from ..compat import new_request_hasher, scheduler_with_hooks
from ..contract import NeuronSchedulerOutput, admitted_ids, is_decode, prompt_tokens_left, rejected_drafts
from ..engine.options import PrefillMode, prefill_chunk_budget, prefill_mode, prefill_target_itl, prefix_caching
from ..log import get_logger
from .interleave import Candidate, InterleavePolicy, plan_slices
from .kv_events import hash_blocks, prefix_of, publish
from .prefix_cache import PrefixCache, PrefixCopy
from .step_budget import StepTimeModel

logger = get_logger(__name__)


class NeuronScheduler(scheduler_with_hooks()):
    def __init__(self, vllm_config, *args, **kwargs) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        neuron_config = load_neuron_config(vllm_config.model_config.model)
        # An artifact without prefill chunks runs whole prompts from position 0: no hit is possible.
        enabled = prefix_caching(vllm_config.additional_config) and neuron_config.chunked
        block_size = vllm_config.cache_config.block_size
        self.prefix_cache = PrefixCache(
            neuron_config.batch_size,
            enabled,
            copies=neuron_config.prefix_copy,
            block_size=block_size,
            report=self.enable_kv_cache_events,
        )
        # vLLM's own block hashes of each request (its prefix caching, which would compute them, stays off).
        self._hasher = (
            new_request_hasher(block_size, vllm_config.cache_config.prefix_caching_hash_algo) if enabled else None
        )
        self._claims: dict[str, int] = {}  # this step's claims while super().schedule() runs: req_id -> hit
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

    def schedule(self, *args, **kwargs) -> NeuronSchedulerOutput:
        self._claims = {}
        try:
            output = (
                super().schedule(*args, **kwargs)
                if self.interleave is None
                else self._schedule_interleaved(*args, **kwargs)
            )
        except BaseException:
            self._settle_claims(admitted=set())
            raise
        return NeuronSchedulerOutput.of(output, *self._settle_claims(admitted_ids(output)))

    def _schedule_interleaved(self, *args, **kwargs) -> SchedulerOutput:
        running = [r for r in self.running if prompt_tokens_left(r) > 0]
        waiting = self._admittable_waiting()
        candidates = [
            Candidate(
                r.request_id,
                left,
                r.num_tokens - left,
                self._passes.get(r.request_id, 0),
                r.arrival_time,
                r.priority,
                holds_slot=r.status == RequestStatus.WAITING and r.num_computed_tokens > 0,
            )  # fmt: skip
            for r in running + waiting
            for left in [self._tokens_to_prefill(r)]
        ]
        decodes = [r.num_computed_tokens for r in self.running if prompt_tokens_left(r) == 0]
        policy, time = self.interleave, None
        if self.step_time is not None:
            time = self.step_time.step(decodes)
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
        """Prompt tokens left; for a request not yet admitted, after the prefix-cache hit it would get now."""
        if request.status == RequestStatus.RUNNING or request.num_computed_tokens or not self._looks_up(request):
            return prompt_tokens_left(request)
        return request.num_tokens - self.prefix_cache.peek(prefix_of(request))

    def _admittable_waiting(self) -> list[Request]:
        """Waiting requests that this step's free slots could take, in the order vLLM's admission loop reaches them:
        its queue of requests holding KV (resumed streaming-input sessions) first, then the waiting queue."""
        limit = min(self.max_num_running_reqs, self.max_num_active_reqs)
        free = limit - len(self.running) - self.num_waiting_for_streaming_input
        ready = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        queued = [*self.kv_holding_waiting, *self.waiting]
        return [r for r in queued if r.status in ready][: max(free, 0)]

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

    # ---- cache slots and prefix caching ---------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if self._hasher is not None:
            hash_blocks(request, self._hasher)
        super().add_request(request)

    def _looks_up(self, request: Request) -> bool:
        return self.prefix_cache.enabled and not request.skip_reading_prefix_cache

    def local_prefix_hit(self, request: Request) -> int:
        """vLLM's admission asks for the request's cached prefix: claim its slot (released again if the request is
        not admitted this step). vLLM starts num_computed_tokens at the hit."""
        claim = self.prefix_cache.claim(request.request_id, prefix_of(request), self._looks_up(request))
        self._claims.pop(request.request_id, None)  # a claim made again moves to the end: copies run in claim order
        self._claims[request.request_id] = claim.hit
        return claim.hit

    def _settle_claims(self, admitted: set[str]) -> tuple[dict[str, int], list[PrefixCopy]]:
        """Keep the claims of admitted requests (their slots and copies, for the runner), undo the others, record the
        hits. An admitted request vLLM asked no hit for is a resumed streaming-input session: it kept its slot, whose
        rows hold its tokens so far, while it waited for input (vLLM keeps its blocks too)."""
        slots = {req_id: self.prefix_cache.slot_of(req_id) for req_id in admitted - self._claims.keys()}
        copies = []
        for req_id, hit in self._claims.items():
            if req_id not in admitted:
                self.prefix_cache.unclaim(req_id)
                continue
            slots[req_id] = self.prefix_cache.slot_of(req_id)
            copy = self.prefix_cache.copy_of(req_id)
            if copy is not None:
                copies.append(copy)
            request = self.requests[req_id]
            if self._looks_up(request):
                self.record_prefix_hit(request, hit)
        self._claims = {}
        return slots, copies

    def request_freed(self, request: Request) -> None:
        self.prefix_cache.release(request.request_id)

    def request_preempted(self, request: Request) -> None:
        self.prefix_cache.release(request.request_id)

    def reset_prefix_cache(self, *args, **kwargs) -> bool:
        reset = super().reset_prefix_cache(*args, **kwargs)
        if reset:
            self.prefix_cache.forget()
        return reset

    # ---- failures -----------------------------------------------------------------------------

    def _report_refilled(self, scheduler_output: NeuronSchedulerOutput, req_ids) -> None:
        """Requests whose prefix copy raised: the runner prefilled their prefix instead, so vLLM reports no cached
        token for them (usage's cached_tokens, taken with their first output, at the earliest this step) and takes
        the hit back from its prefix-cache hit counters (recorded at admission, this step: the same stats window)."""
        hits = {copy.req_id: copy.length for copy in scheduler_output.copies}
        for req_id in req_ids:
            request = self.requests.get(req_id)
            if request is None:
                continue
            if request.prefill_stats is not None:
                request.prefill_stats.set(request.num_prompt_tokens, 0, 0)
            if self._looks_up(request):
                self.take_back_prefix_hit(request, hits[req_id])

    def update_from_output(self, scheduler_output, model_runner_output: ModelRunnerOutput):
        failed = getattr(model_runner_output, "failed_req_ids", None)
        latencies = getattr(model_runner_output, "graph_latencies", None)
        if latencies is not None and self.interleave is not None and self._fixed_budget is None:
            self._use_latencies(latencies)
        self._report_refilled(scheduler_output, getattr(model_runner_output, "refilled_req_ids", ()))
        # Before vLLM finishes the requests that stopped: what this step's successful calls wrote.
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)  # None: aborted while the step ran (its slot is already released)
            if request is not None and (not failed or req_id not in failed):
                rejected = rejected_drafts(scheduler_output, model_runner_output, req_id)
                self.prefix_cache.commit(req_id, request.num_computed_tokens - rejected)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        # The blocks this step's claims, commits and finished requests made hits or overwrote (kv_events.py).
        if self.enable_kv_cache_events:
            publish(self.kv_event_publisher, self.prefix_cache.take_changes(), self.prefix_cache.block_size)
        if failed:
            for request in self.finish_requests(failed, RequestStatus.FINISHED_ERROR):
                error = EngineCoreOutput(
                    request_id=request.request_id, new_token_ids=[], finish_reason=request.get_finished_reason()
                )
                client = outputs.setdefault(request.client_index, EngineCoreOutputs(outputs=[]))
                client.outputs.append(error)
        return outputs
