"""NeuronModelRunner: turns each vLLM step into runtime calls.

Per step: one token_generation call (runtime.decode) for every request that is decoding, then the prompt slices
scheduled this step, one request at a time (runtime.prefill is the chunk loop: chunks of prefill_chunk_size, the
last padded), or side by side when the artifact was exported with prefill_batch_size > 1 (runtime.prefill_batch:
chunk k of several prompts in one call). When a step has both and prefills a single slice (or cannot batch), the
decode batch rides in one of that slice's chunks: one chunk_and_decode call (runtime.prefill_and_decode) instead
of two, so a step that prefills costs the decoding requests almost nothing. If that call raises, the batch and the
slice run apart, so a bad prompt fails alone, as it would without the fused graph. A request whose prompt is
complete samples its first token on the host from the prefill logits; later tokens come from decode (sampled on
device, or on the host when the artifact returns logits). The same code serves both prefill modes: in serial mode
vLLM schedules whole prompts, in interleaved mode vLLM's scheduler hands out slices. A request asking for prompt
logprobs is prefilled alone on the prompt_logits graphs (runtime.prefill_positions, prompt_logprobs.py).

Prefix caching (prefix_cache.py): a request whose prefix another request's slot holds has those rows copied into its
own slot (runtime.copy_prefix) before any other graph call of the step; then it prefills from its hit like any other.

Speculative decoding (speculation.py): decoding requests with draft tokens go in one verify call (runtime.verify) and
keep their accepted drafts plus one token (speculative.accept); after each step the runner proposes the next drafts
(vLLM's n-gram proposer, or the draft model's graphs: draft_model.py), which vLLM collects with take_draft_token_ids.

Structured outputs (grammar.py): a step whose requests sample under a grammar runs once vLLM's bitmask is known. Host
sampling masks its logits with vLLM's own bitmask application; on-device sampling passes the bitmask to the decode
graph, which masks before top-k / top-p.
"""

from __future__ import annotations

import time

from vllm.config import VllmConfig
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

from ..graphs import CHUNK_AND_DECODE, COPY_PREFIX, PROMPT_LOGITS, TOKEN_GENERATION, VERIFY
from ..models.sampling import bitmask_words
from ..runtime import NeuronModelForCausalLM
from ..sampling import GREEDY, host_topk
from ..speculative import accept
from .draft_gate import DraftGate, min_acceptance
from .grammar import StepGrammar
from .health import GraphHealth
from .host_sampling import HostSampler, TokenLogprobs, device_token_logprobs, logprobs_lists, token_logprobs
from .log import WarmUpLog, get_logger
from .prefix_cache import PrefixCopy
from .prompt_logprobs import record_prompt_logprobs, wants_prompt_logprobs
from .requests import RequestState, SeedSource
from .scheduler import NeuronRunnerOutput
from .speculation import make_drafter
from .stats import StatsSink
from .step import ScheduledSlice, StepPlan, computed_tokens, released_ids, resumed_token_ids, scheduled_drafts
from .token_constraints import constrained_bitmask
from .verify_cost import NextRow, PooledRate, VerifyCosts

logger = get_logger(__name__)


def ids(work: list[ScheduledSlice]) -> list[str]:
    return [w.req_id for w in work]


class FusedCallFailed(Exception):
    """runtime.prefill_and_decode raised (its cause); nothing of the step was recorded, so it can run apart."""


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
        self.grammar = StepGrammar(SchedulerOutput.make_empty(), None)  # the step's (execute)
        self.drafter = make_drafter(vllm_config)
        self.min_acceptance = min_acceptance() if self.drafter is not None else 0.0
        self._drafts: DraftTokenIds | None = None  # proposed after the last step, for take_draft_token_ids
        # Measured at warm-up unless ONP_SPECULATION_MIN_ACCEPTANCE=0 (then every draft is verified).
        self.verify_costs: VerifyCosts | None = None
        self.pooled_acceptance = PooledRate()  # a request's expected acceptance before its own first verify

    # ---- request bookkeeping ------------------------------------------------------------------

    def update_states(self, scheduler_output: SchedulerOutput) -> None:
        # The scheduler owns the cache slots (prefix_cache.py): it names the slot of each request it admits.
        slots = scheduler_output.slots
        finished, preempted = released_ids(scheduler_output)
        for req_id in finished:
            self._finish(req_id)
        for req_id in preempted:
            self._release_slot(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            state = RequestState.create(
                new.req_id, new.prompt_token_ids or [], new.sampling_params, self._default_seed(new.sampling_params)
            )
            state.slot = slots[state.req_id]
            state.stats.cached_tokens = new.num_computed_tokens
            self.requests[state.req_id] = state
        for req_id, token_ids in resumed_token_ids(scheduler_output).items():
            state = self.requests[req_id]
            if token_ids is not None:
                state.resync(token_ids)
            state.slot = slots[req_id]

    def _default_seed(self, params) -> int | None:
        """A seed from --seed for an unseeded request (drawn for every request, so admission order alone decides)."""
        return self.seeds.next_seed() if params.seed is None else None

    def _release_slot(self, req_id: str) -> None:
        state = self.requests.get(req_id)
        if state is not None:
            state.slot = None

    def _finish(self, req_id: str) -> None:
        self._release_slot(req_id)
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
            is_decode = state.output_token_ids and work.count == 1 and work.start == state.num_tokens - 1
            (plan.decodes if is_decode else plan.prefills).append(work)
        return plan

    def execute(
        self, scheduler_output: SchedulerOutput, grammar_output: GrammarOutput | None = None
    ) -> ModelRunnerOutput:
        """The step's graph calls and sampled tokens; grammar_output: vLLM's bitmask of its structured requests."""
        self.grammar = StepGrammar(scheduler_output, grammar_output)
        plan = self.plan(scheduler_output)
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, TokenLogprobs] = {}
        failed = self._copy_prefixes(scheduler_output.copies)
        plan.decodes, plan.prefills = (
            [w for w in work if w.req_id not in failed] for work in (plan.decodes, plan.prefills)
        )
        verifies, plan.decodes = self._split_verifies(plan.decodes)
        if verifies:
            failed += self._verify(verifies, sampled)
        # Slices of requests asking for prompt logprobs run alone on the prompt_logits graphs.
        positions = [w for w in plan.prefills if wants_prompt_logprobs(self.requests[w.req_id])]
        prefills = [w for w in plan.prefills if w not in positions]
        prompt_logprobs: dict = {}
        if plan.decodes and prefills and self.model.fuses_prefill_and_decode and not self._together(prefills):
            # The first prompt slice goes with the decode batch (chunk_and_decode).
            try:
                self._decode(plan.decodes, sampled, logprobs, with_prefill=prefills[0])
                self.health.succeeded()
                prefills.pop(0)
            except FusedCallFailed as error:  # isolate the failure: run the batch and the slice apart
                cause = error.__cause__
                logger.warning(
                    "graph %s raised %s: %s; running its decode batch and its prompt slice in separate calls",
                    CHUNK_AND_DECODE, type(cause).__name__, cause,
                )  # fmt: skip
                self._decode_alone(plan.decodes, sampled, logprobs, failed)
            except Exception as error:  # noqa: BLE001 - after the call: fail its requests (scheduler.py)
                failed += self._graph_failed(CHUNK_AND_DECODE, ids(plan.decodes + [prefills.pop(0)]), error)
        elif plan.decodes:
            self._decode_alone(plan.decodes, sampled, logprobs, failed)
        failed += self._prefill_slices(prefills, bool(plan.decodes), sampled, logprobs)
        failed += self._prefill_positions(positions, bool(plan.decodes), sampled, logprobs, prompt_logprobs)
        for req_id in failed:
            sampled.pop(req_id, None)
            logprobs.pop(req_id, None)
            prompt_logprobs.pop(req_id, None)
        self._propose_drafts(sampled)
        req_ids = list(scheduler_output.num_scheduled_tokens)
        return NeuronRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=[sampled.get(req_id, []) for req_id in req_ids],
            logprobs=logprobs_lists([logprobs.get(req_id) for req_id in req_ids]),
            prompt_logprobs_dict=prompt_logprobs,
            failed_req_ids=failed,
        )

    def _copy_prefixes(self, copies: list[PrefixCopy]) -> list[str]:
        """The step's prefix copies (prefix_cache.py), in claim order, before its other graph calls: a source's rows
        [0, length) are still what its owner committed. The draft model's cache copies alongside. A copy that
        raises fails its request only. Returns the failed requests."""
        failed = []
        for copy in copies:
            try:
                self.model.copy_prefix(copy.source, copy.destination, copy.length)
                self.health.succeeded()
            except Exception as error:  # noqa: BLE001 - any graph failure fails its requests (scheduler.py)
                failed += self._graph_failed(COPY_PREFIX, [copy.req_id], error)
                continue
            self.requests[copy.req_id].stats.copied = True
            if self.drafter is not None:
                self.drafter.copy_prefix(copy.source, copy.destination, copy.length)
        return failed

    # ---- speculative decoding (speculation.py) ---------------------------------------------------

    def _speculates(self, state: RequestState) -> bool:
        """Drafts are proposed and verified only for requests whose tokens the plain sampler draws."""
        return (
            self.drafter is not None
            and state.params.structured_outputs is None
            and not state.wants_logprobs
            and not state.needs_logits_processing()
        )

    def _split_verifies(self, decodes: list[ScheduledSlice]) -> tuple[list[ScheduledSlice], list[ScheduledSlice]]:
        """(the verify call's rows, the other decodes): when a request has drafts, every decode that may speculate
        goes in the verify call (a row without drafts verifies just its token), the rest decode as usual."""
        if not any(w.drafts for w in decodes):
            return [], decodes
        verifies = [w for w in decodes if self._speculates(self.requests[w.req_id])]
        if not any(w.drafts for w in verifies):
            return [], decodes
        return verifies, [w for w in decodes if w not in verifies]

    def _verify(self, work: list[ScheduledSlice], sampled: dict[str, list[int]]) -> list[str]:
        """One verify call; each row keeps its accepted drafts and one more token. Returns the failed requests."""
        states = [self.requests[w.req_id] for w in work]
        try:
            logits = self.model.verify(
                [s.slot for s in states],
                [[s.all_token_ids[w.start], *w.drafts] for s, w in zip(states, work, strict=True)],
                [w.start for w in work],
            )
            self.health.succeeded()
        except Exception as error:  # noqa: BLE001 - any graph failure fails its requests (scheduler.py)
            return self._graph_failed(VERIFY, ids(work), error)
        nc = self.model.neuron_config
        max_topk = host_topk(nc.on_device_sampling, nc.max_topk)
        all_accepted = 0
        for row, (state, w) in enumerate(zip(states, work, strict=True)):
            tokens = accept(logits[row], list(w.drafts), state.sampling, state.generator, max_topk)
            accepted = len(tokens) - 1  # the last token is the model's own
            state.output_token_ids.extend(tokens)
            state.stats.draft_tokens += len(w.drafts)
            state.stats.accepted_tokens += accepted
            self._gate(state).verified(len(w.drafts), accepted)
            sampled[state.req_id] = tokens
            all_accepted += accepted
        self.pooled_acceptance.verified(sum(len(w.drafts) for w in work), all_accepted)
        return []

    def _propose_drafts(self, sampled: dict[str, list[int]]) -> None:
        """The proposer's drafts for every request that sampled this step and may speculate."""
        if self.drafter is None:
            return
        states = [self.requests[r] for r, tokens in sampled.items() if tokens and self._speculates(self.requests[r])]
        states = [s for s in states if self._gate(s).open()]
        drafts = self.drafter.propose([s.slot for s in states], [s.all_token_ids for s in states])
        if not self._drafts_pay(sampled, dict(zip((s.req_id for s in states), drafts, strict=True))):
            drafts = [[] for _ in states]
        req_ids = [s.req_id for s in states]
        self._drafts = DraftTokenIds(req_ids, drafts)

    def _drafts_pay(self, sampled: dict[str, list[int]], drafts: dict[str, list[int]]) -> bool:
        """Whether next step's verify call is worth its cost (verify_cost.py), the requests that sampled this step
        decoding next."""
        if self.verify_costs is None:
            return True
        rows = []
        for req_id, tokens in sampled.items():
            if not tokens:
                continue
            state = self.requests[req_id]
            own = state.draft_gate.rate if state.draft_gate is not None else -1.0  # -1: not verified yet
            rate = own if own >= 0 else self.pooled_acceptance.rate
            rows.append(NextRow(state.num_tokens, len(drafts.get(req_id, ())), rate, self._speculates(state)))
        return self.verify_costs.drafts_pay(self.model, rows)

    def _gate(self, state: RequestState) -> DraftGate:
        if state.draft_gate is None:
            state.draft_gate = DraftGate(self.min_acceptance)
        return state.draft_gate

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed after the last step (vLLM's engine stores them on its requests for the next)."""
        drafts, self._drafts = self._drafts, None
        return drafts

    def _decode_alone(self, work: list[ScheduledSlice], sampled, logprobs, failed: list[str]) -> None:
        try:
            self._decode(work, sampled, logprobs, with_prefill=None)
            self.health.succeeded()
        except Exception as error:  # noqa: BLE001 - any graph failure fails its requests (scheduler.py)
            failed += self._graph_failed(TOKEN_GENERATION, ids(work), error)

    def _graph_failed(self, graph: str, req_ids: list[str], error: Exception) -> list[str]:
        """The requests of a graph call that raised: NeuronScheduler finishes them with an error.

        Too many failed calls in a row stop the engine instead (health.py).
        """
        stop = self.health.failed()
        logger.error(
            "graph %s (%s) raised %s: %s; failing request(s) %s%s",
            graph,
            self._graph_files(graph),
            type(error).__name__,
            error,
            ", ".join(req_ids),
            "" if stop else ", the server keeps serving",
            exc_info=error,
        )
        if stop:
            raise self.health.stop_error(graph, error) from error
        return req_ids

    def _graph_files(self, graph: str) -> str:
        return ", ".join(str(path) for path in self.model.graph_files(graph))

    def _decode(self, work: list[ScheduledSlice], sampled, logprobs, with_prefill: ScheduledSlice | None) -> None:
        states = [self.requests[w.req_id] for w in work]
        req_ids = [w.req_id for w in work]
        on_device = self.model.neuron_config.on_device_sampling
        # Rows whose logits need processing on the host (every kind on host logits; penalties) are sampled here
        # afterwards: the runtime treats them as greedy without a generator, so it draws no randomness for them. On
        # device a grammar, min_tokens, allowed_token_ids and bad_words are the graph's bitmask instead, min_p and
        # logit_bias its sampling inputs.
        processed = [
            s.has_penalties() or (not on_device and (s.needs_logits_processing() or s.req_id in self.grammar))
            for s in states
        ]
        words = bitmask_words(self.model.args.vocab_size)
        bitmask = constrained_bitmask(self.grammar.bitmask(req_ids, words), states, words) if on_device else None
        batch = (
            [s.slot for s in states],
            [s.all_token_ids[w.start] for s, w in zip(states, work, strict=True)],
            [w.start for w in work],
            [GREEDY if p else s.sampling for s, p in zip(states, processed, strict=True)],
            [None if p else s.generator for s, p in zip(states, processed, strict=True)],
        )
        if with_prefill is None:
            result = self.model.decode(*batch, bitmask=bitmask)
        else:
            state, tokens, began = self._prompt_slice(with_prefill)
            try:
                prefill_logits, result = self.model.prefill_and_decode(
                    state.slot, tokens, with_prefill.start, *batch, bitmask=bitmask
                )
            except Exception as error:
                raise FusedCallFailed from error
            self._prefilled(with_prefill, prefill_logits, began, True, sampled, logprobs)
        tokens = list(result.tokens)
        rows = [i for i, p in enumerate(processed) if p]
        if rows:
            if result.logits is None:
                raise RuntimeError(
                    "logits processing needs host logits; the platform should have rejected this request"
                )
            self.grammar.mask_host_logits(result.logits, req_ids)
            for i, token in zip(
                rows, self.host_sampler.sample(result.logits[rows], [states[i] for i in rows]), strict=True
            ):
                tokens[i] = token
        for i, state in enumerate(states):
            if state.wants_logprobs and result.logprobs is not None:
                logprobs[state.req_id] = device_token_logprobs(result.logprobs, i, state.params.logprobs)
            self._append(state, tokens[i], None if result.logits is None else result.logits[i], sampled, logprobs)

    def _prefill_slices(self, prefills: list[ScheduledSlice], interleaved: bool, sampled, logprobs) -> list[str]:
        """The step's prompt slices: together (runtime.prefill_batch) when the artifact has prefill batch graphs,
        else, or when that call raises, one at a time, so that a failing prompt fails alone. Returns failed ids."""
        if self._together(prefills):
            try:
                self._prefill_together(prefills, interleaved, sampled, logprobs)
                self.health.succeeded()
                return []
            except Exception as error:  # noqa: BLE001 - nothing was recorded: the slices run one at a time
                logger.warning("batched prefill raised %s: %s; prefilling its prompt slices one at a time",
                               type(error).__name__, error)  # fmt: skip
        failed = []
        for work in prefills:
            try:
                self._prefill(work, interleaved=interleaved, sampled=sampled, logprobs=logprobs)
                self.health.succeeded()
            except Exception as error:  # noqa: BLE001
                failed += self._graph_failed(self.model.neuron_config.prefill_graph, [work.req_id], error)
        return failed

    def _prefill_positions(self, prefills: list[ScheduledSlice], interleaved: bool, sampled, logprobs, prompt_logprobs):
        """Prompt slices of requests asking for prompt logprobs, one at a time on the prompt_logits graphs: every
        position's logits, whose logprobs fill the request's prompt logprobs (prompt_logprobs.py). Returns failed ids."""
        failed = []
        for work in prefills:
            state, tokens, began = self._prompt_slice(work)
            try:
                logits = self.model.prefill_positions(state.slot, tokens, start=work.start)
                self.health.succeeded()
            except Exception as error:  # noqa: BLE001
                state.prompt_logprobs = None
                failed += self._graph_failed(PROMPT_LOGITS, [work.req_id], error)
                continue
            done = record_prompt_logprobs(state, logits, work.start)
            if done is not None:
                prompt_logprobs[work.req_id] = done
            self._prefilled(work, logits[-1], began, interleaved, sampled, logprobs)
        return failed

    def _together(self, prefills: list[ScheduledSlice]) -> bool:
        """The step's prompt slices are prefilled together. The decode batch then runs alone rather than riding in
        one slice's chunk: a batched chunk saves ~25% of every prompt row's compute, a ride saves one decode call."""
        return len(prefills) > 1 and self.model.neuron_config.prefill_batch_size > 1

    def _prefill_together(self, prefills: list[ScheduledSlice], interleaved: bool, sampled, logprobs) -> None:
        slices = [self._prompt_slice(work) for work in prefills]
        prompts = [(state.slot, tokens, work.start) for (state, tokens, _), work in zip(slices, prefills, strict=True)]
        logits = self.model.prefill_batch(prompts)
        for work, (state, _, began), row in zip(prefills, slices, logits, strict=True):
            state.stats.batched = True
            self._prefilled(work, row, began, interleaved, sampled, logprobs)

    def _prefill(self, work: ScheduledSlice, interleaved: bool, sampled, logprobs) -> None:
        state, tokens, began = self._prompt_slice(work)
        logits = self.model.prefill(state.slot, tokens, start=work.start)
        self._prefilled(work, logits, began, interleaved, sampled, logprobs)

    def _prompt_slice(self, work: ScheduledSlice) -> tuple[RequestState, list[int], float]:
        state = self.requests[work.req_id]
        return state, state.all_token_ids[work.start : work.start + work.count], time.perf_counter()

    def _prefilled(self, work: ScheduledSlice, logits, began: float, interleaved: bool, sampled, logprobs) -> None:
        """Stats of a prompt slice; a complete prompt samples its first token on the host from the logits."""
        state = self.requests[work.req_id]
        state.stats.prefill_seconds += time.perf_counter() - began
        state.stats.prefill_calls += self.model.prefill_calls(work.count)
        state.stats.prefill_steps += 1
        state.stats.interleaved |= interleaved
        if work.start + work.count == state.num_tokens:
            self.grammar.mask_host_logits(logits[None], [state.req_id])
            self._append(state, self.host_sampler.sample(logits[None], [state])[0], logits, sampled, logprobs)

    @staticmethod
    def _append(state: RequestState, token: int, logits, sampled, logprobs) -> None:
        state.output_token_ids.append(token)
        sampled[state.req_id] = [token]
        if state.wants_logprobs and logits is not None:
            logprobs[state.req_id] = token_logprobs(logits, token, state.params.logprobs)

    def warm_up(self) -> float:
        """Every compiled graph once (runtime.warm_up): a graph that cannot run stops the startup, naming its file."""
        began = time.perf_counter()
        self.model.warm_up(WarmUpLog(logger, "the model"))
        if self.drafter is not None:
            self.drafter.warm_up()
            if self.min_acceptance > 0:
                self.verify_costs = VerifyCosts.measure(self.model)
                logger.info(
                    "speculative decoding: a verify call takes %s decode calls (per row count): drafts go to vLLM "
                    "only when their expected accepted tokens pay for it",
                    self.verify_costs.verify_over_decode(self.model),
                )
        return time.perf_counter() - began

    def shutdown(self) -> None:
        for req_id in list(self.requests):
            self._finish(req_id)
