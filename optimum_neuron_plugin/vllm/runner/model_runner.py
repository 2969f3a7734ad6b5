"""NeuronModelRunner: turns each vLLM step into graph calls on the runtime.

A step is data: the runner writes each scheduled request's vLLM block ids into the block table of its batch row
(runner/rows.py), reads vLLM's SchedulerOutput into a StepPlan (runner/step_input.py: the decoding requests and the
prompt slices, in waves when a slice reads blocks another writes this step), turns it into an ordered list of graph
calls (call_plan.plan_calls, where the order is written down: verify, the decode batch (riding in a prompt chunk
when it can), the prompt slices, the prompt logprobs slices; then the next wave's slices), each naming its requests
and its fallback, and runs the list in one guarded loop
(runner/call_loop.py) that owns failure isolation, the engine's health and the requests' generators. One call is
runner/call_executor.py's; the step's tokens, logprobs and failed requests come back in one StepResult, from which the runner
builds vLLM's output. After the step, speculative decoding proposes the next drafts (spec_decode/bookkeeping.py).

The same code serves both prefill modes: in serial mode vLLM schedules whole prompts, in interleaved mode vLLM's
scheduler hands out slices, fitted to a latency target from the graph latencies the runner measures at warm-up and
reports with its first output (scheduler/step_budget.py). Prefix caching is vLLM's: a hit is a request's first blocks,
shared with the requests that wrote them, and its prefill starts after them.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from contextlib import nullcontext

from vllm.config import VllmConfig
from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, DraftTokenIds, KVConnectorOutput, ModelRunnerOutput

from ...runtime import NeuronModelForCausalLM
from ...runtime.latency import GraphLatencies
from ...sampling import host_topk
from ..contract import NeuronRunnerOutput, computed_tokens, runs_as_decode_row
from ..engine.options import PrefillMode, prefill_chunk_budget, prefill_mode
from ..log import WarmUpLog, get_logger
from ..sampling.grammar import StepGrammar
from ..sampling.host_sampling import HostSampler, logprobs_lists
from ..scheduler.step_budget import measured_kind
from ..spec_decode.bookkeeping import SpeculativeDecoding
from .call_executor import CallExecutor
from .call_loop import GuardedCalls
from .call_plan import CallKind, GraphCall, StepResult, plan_calls
from .health import GraphHealth
from .kv_transfer import KVTransfer
from .lora_slots import LoraSlots
from .prompt_logprobs import wants_prompt_logprobs
from .request_state import RequestState, SeedSource
from .rows import Rows, SliceBlocks, waves
from .stats import StatsSink
from .step_input import ScheduledSlice, StepPlan, only_group, released_ids, resumed_token_ids, scheduled_drafts

logger = get_logger(__name__)


class NeuronModelRunner:
    def __init__(self, model: NeuronModelForCausalLM, vllm_config: VllmConfig, stats: StatsSink | None = None) -> None:
        self.model = model
        self.requests: dict[str, RequestState] = {}
        self.stats = stats or StatsSink()
        nc = model.neuron_config
        # First tokens follow the device's top-k rule (sampling.host_topk).
        self.host_sampler = HostSampler(vllm_config, host_topk(nc.on_device_sampling, nc.max_topk), model.group)
        self.seeds = SeedSource(vllm_config.model_config.seed)
        self.health = GraphHealth()
        self.speculation = SpeculativeDecoding(vllm_config, model)
        self.executor = CallExecutor(model, self.requests, self.host_sampler, self.speculation)
        self.calls = GuardedCalls(self.executor, self.requests, self.health, self._graph_files)
        extra = vllm_config.additional_config
        # The interleaved scheduler's latency target needs the graphs' latencies (scheduler/step_budget.py).
        self.measures_latencies = prefill_mode(extra) is PrefillMode.INTERLEAVED and prefill_chunk_budget(extra) is None
        self.latencies: GraphLatencies | None = None  # measured at warm-up, reported with the first output
        self.rows = Rows(nc.batch_size)
        lora = vllm_config.lora_config
        self.loras = None if lora is None else LoraSlots(model, lora.max_cpu_loras or lora.max_loras)
        self.adapter_failures: list[str] = []  # requests of the step whose adapter could not be put in a slot
        self.kv_transfer: KVTransfer | None = None  # --kv-transfer-config: set by the worker once vLLM sized the pool
        self.block_size = nc.block_size
        for row in range(nc.batch_size):  # vLLM's blocks from now on: no row holds any until a request is scheduled
            model.graph_set.tables.assign(row, [])

    # ---- request bookkeeping ------------------------------------------------------------------

    def update_states(self, scheduler_output: SchedulerOutput) -> None:
        """The step's requests and their vLLM block ids (new and resumed requests: all of them; running ones: the blocks
        appended this step), then each scheduled request's row and block table (rows.py)."""
        finished, preempted = released_ids(scheduler_output)
        for req_id in finished:
            self._finish(req_id)
        for req_id in preempted:
            self._release_row(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in self.requests:  # a streaming-input session's next input: its blocks hold the tokens so far
                state = self.requests[new.req_id]
                state.continue_session(new.prompt_token_ids or [], new.sampling_params)
            else:
                state = RequestState.create(
                    new.req_id, new.prompt_token_ids or [], new.sampling_params,
                    self._default_seed(new.sampling_params),
                )  # fmt: skip
                state.stats.cached_tokens = new.num_computed_tokens
                state.lora_request = new.lora_request
                self.requests[state.req_id] = state
            state.block_ids = only_group(new.block_ids)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = resumed_token_ids(scheduler_output)
        for req_id, block_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            state = self.requests[req_id]
            if req_id in resumed:  # preempted, then admitted again: its blocks are new, its K/V computed again
                if resumed[req_id] is not None:
                    state.resync(resumed[req_id])
                state.block_ids = only_group(block_ids)
            elif block_ids is not None:
                state.block_ids.extend(only_group(block_ids))
        self._write_tables(scheduler_output.num_scheduled_tokens.keys())

    def _write_tables(self, scheduled: Collection[str]) -> None:
        tables = self.model.graph_set.tables
        live = self._live_loras(scheduled)
        for req_id in scheduled:
            state = self.requests[req_id]
            if state.slot is None:
                state.slot, taken = self.rows.take(req_id, keep=scheduled)
                if taken is not None:
                    self.requests[taken].slot = None
            tables.assign(state.slot, state.block_ids)
            if self.loras is not None:  # the row runs its request's adapter, copied into a slot if needed
                self._assign_adapter(state, live)

    def _assign_adapter(self, state: RequestState, live: set[int]) -> None:
        """A request whose adapter cannot be read (vLLM's offline API reads it only now) fails alone."""
        try:
            self.model.graph_set.adapters.of_seq[state.slot] = self.loras.slot(state.lora_request, live)
        except (ValueError, LoRAAdapterNotFoundError) as error:
            logger.error("request %s: its LoRA adapter cannot be served: %s", state.req_id, error)
            self.adapter_failures.append(state.req_id)

    def _live_loras(self, scheduled: Collection[str]) -> set[int]:
        """The adapters of the step's requests and of every request holding a row: their slots are kept."""
        states = [self.requests[r] for r in scheduled] + [s for s in self.requests.values() if s.slot is not None]
        return {s.lora_request.lora_int_id for s in states if s.lora_request is not None}

    def _default_seed(self, params) -> int | None:
        """A seed from --seed for an unseeded request (drawn for every request, so admission order alone decides)."""
        return self.seeds.next_seed() if params.seed is None else None

    def _release_row(self, req_id: str) -> None:
        """The request no longer runs (preempted, finished): its row's table points at the null block again."""
        state = self.requests.get(req_id)
        if state is not None and state.slot is not None:
            self.rows.release(state.slot)
            self.model.graph_set.tables.assign(state.slot, [])
            self.model.graph_set.adapters.of_seq[state.slot] = 0
            state.slot = None

    def _finish(self, req_id: str) -> None:
        self._release_row(req_id)
        state = self.requests.pop(req_id, None)
        if state is not None:
            self.stats.finished(state)

    # ---- one step -----------------------------------------------------------------------------

    def plan(self, scheduler_output: SchedulerOutput) -> StepPlan:
        starts = computed_tokens(scheduler_output)
        plan = StepPlan()
        for req_id, count in scheduler_output.num_scheduled_tokens.items():
            state = self.requests[req_id]
            scheduled, drafts = scheduled_drafts(scheduler_output, req_id)
            work = ScheduledSlice(req_id, starts[req_id], count - len(scheduled), drafts)
            if work.start + work.count > state.num_tokens:
                raise RuntimeError(
                    f"request {req_id}: {work.count} known tokens scheduled from position {work.start} but only "
                    f"{state.num_tokens} are known"
                )
            decoding = work.count == 1 and self._feeds_last_token(state, work)
            (plan.decodes if decoding else plan.prefills).append(work)
        slices = [SliceBlocks(w, self.requests[w.req_id].block_ids) for w in (*plan.decodes, *plan.prefills)]
        plan.waves = waves(slices, self.block_size)
        # A decode whose context another request writes this step (a resumed request's hit) runs as a prompt slice.
        later = [w for w in plan.decodes if plan.waves.levels[w.req_id]]
        plan.decodes = [w for w in plan.decodes if w not in later]
        plan.prefills += later
        return plan

    @staticmethod
    def _feeds_last_token(state: RequestState, work: ScheduledSlice) -> bool:
        """A one-token slice that runs as a decode row (contract.runs_as_decode_row)."""
        prefilled, logprobs = state.stats.prefill_calls > 0, wants_prompt_logprobs(state)
        return runs_as_decode_row(state.num_tokens, work.start, len(state.output_token_ids), prefilled, logprobs)

    def graph_calls(self, plan: StepPlan) -> list[GraphCall]:
        """The step's graph calls, in order (call_plan.plan_calls), wave by wave (rows.py)."""
        verifies, decodes = self.speculation.split_verifies(plan.decodes, self.requests)
        calls = []
        for wave in range(plan.waves.count):
            slices = [w for w in plan.prefills if plan.waves.levels[w.req_id] == wave]
            # Slices of requests asking for prompt logprobs run alone on the prompt_logits graphs.
            positions = [w for w in slices if wants_prompt_logprobs(self.requests[w.req_id])]
            prefills = [w for w in slices if w not in positions]
            nc = self.model.neuron_config
            calls += plan_calls(
                verifies, decodes, prefills, positions,
                fuses=self.model.fuses_prefill_and_decode, prefill_batch_size=nc.prefill_batch_size,
            )  # fmt: skip
            verifies, decodes = [], []
        return calls

    def execute(
        self, scheduler_output: SchedulerOutput, grammar_output: GrammarOutput | None = None
    ) -> ModelRunnerOutput:
        """The step's graph calls and sampled tokens; grammar_output: vLLM's bitmask of its structured requests."""
        self.executor.grammar = StepGrammar(scheduler_output, grammar_output)
        plan = self.plan(scheduler_output)
        failed, self.adapter_failures = self.adapter_failures, []
        transfer = self.kv_transfer.around_graphs(scheduler_output) if self.kv_transfer else nullcontext()
        with transfer as kv_output:  # a connector loads before the graphs and saves after them (kv_transfer.py)
            # A request whose KV failed to load runs no graph; vLLM's kv_load_failure_policy fails or recomputes it.
            skipped = [*failed, *self._unloaded(kv_output.invalid_block_ids if kv_output else set())]
            calls = [c for c in (call.without(skipped) for call in self.graph_calls(plan)) if c is not None]
            step = self.calls.run(calls, plan.waves.producers)
        step.failed += failed
        if not self.calls.retired(CallKind.VERIFY):  # drafts nothing can verify would only cost their proposal
            self.speculation.propose(step.tokens, self.requests)
        return self._output(list(scheduler_output.num_scheduled_tokens), step, kv_output)

    def _unloaded(self, invalid_block_ids: set[int]) -> list[str]:
        """The requests holding a block a KV connector failed to load."""
        if not invalid_block_ids:
            return []
        return [r for r, state in self.requests.items() if invalid_block_ids.intersection(state.block_ids)]

    def execute_without_graphs(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """A step with no scheduled tokens: only a KV connector's transfers (finished sends, loads) run."""
        if self.kv_transfer is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        return ModelRunnerOutput.with_kv_conn_output_only(self.kv_transfer.without_graphs(scheduler_output))

    # A step that runs graphs for no request (data parallelism's dummy step) belongs here, next to execute.

    def _output(
        self, req_ids: list[str], step: StepResult, kv_output: KVConnectorOutput | None = None
    ) -> NeuronRunnerOutput:
        latencies, self.latencies = self.latencies, None
        return NeuronRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=[step.tokens.get(req_id, []) for req_id in req_ids],
            logprobs=logprobs_lists([step.logprobs.get(req_id) for req_id in req_ids]),
            prompt_logprobs_dict=step.prompt_logprobs,
            failed_req_ids=step.failed,
            graph_latencies=latencies,
            kv_connector_output=kv_output,
        )

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed after the last step (vLLM's engine stores them on its requests for the next)."""
        return self.speculation.take()

    def _graph_files(self, graph: str) -> str:
        return ", ".join(str(path) for path in self.model.graph_files(graph))

    def warm_up(self) -> float:
        """Every compiled graph once (runtime.warm_up): a graph that cannot run stops the startup, naming its file."""
        began = time.perf_counter()
        self.model.warm_up(WarmUpLog(logger, "the model"))
        self.speculation.warm_up()
        if self.measures_latencies:
            nc = self.model.neuron_config
            measuring = time.perf_counter()
            self.latencies = self.model.measure_latencies(lambda spec: measured_kind(nc, spec.name, spec.rows))
            logger.info(
                "interleaved prefill's latency target: measured %d graphs in %.1f s",
                len(self.latencies.seconds), time.perf_counter() - measuring,
            )  # fmt: skip
        return time.perf_counter() - began

    def shutdown(self) -> None:
        for req_id in list(self.requests):
            self._finish(req_id)
        if self.kv_transfer is not None:
            self.kv_transfer.shutdown()
