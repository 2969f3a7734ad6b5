"""One graph call of a step (runner/call_plan.py) on the runtime, and what it yields: a StepResult of its own.

A call changes no request's tokens: the guarded loop (runner/call_loop.py) appends them once the call has succeeded.
A complete prompt samples its first token on the host from the prefill logits; decode tokens are sampled on the
device, or on the host when the artifact returns logits or a row's logits need processing (penalties). Structured
outputs (grammar.py): host sampling masks its logits with vLLM's bitmask; on-device sampling passes the bitmask to the
decode graph, which masks before top-k / top-p.
"""

from __future__ import annotations

import time

from vllm.v1.core.sched.output import SchedulerOutput

from ...graphs import CHUNK_AND_DECODE, PROMPT_LOGITS, TOKEN_GENERATION, VERIFY
from ...models.sampling import bitmask_words
from ...runtime import NeuronModelForCausalLM
from ...sampling import GREEDY
from ..sampling.grammar import StepGrammar
from ..sampling.host_sampling import HostSampler, device_token_logprobs, token_logprobs
from ..sampling.token_constraints import constrained_bitmask
from ..spec_decode.bookkeeping import SpeculativeDecoding
from .call_plan import CallKind, GraphCall, PrefillRecord, StepResult
from .prompt_logprobs import record_prompt_logprobs
from .request_state import RequestState
from .step_input import ScheduledSlice


class CallExecutor:
    def __init__(
        self, model: NeuronModelForCausalLM, requests: dict[str, RequestState], host_sampler: HostSampler,
        speculation: SpeculativeDecoding,
    ) -> None:  # fmt: skip
        self.model = model
        self.requests = requests
        self.host_sampler = host_sampler
        self.speculation = speculation
        self.grammar = StepGrammar(SchedulerOutput.make_empty(), None)  # the step's (NeuronModelRunner.execute)
        self._run = {
            CallKind.VERIFY: self._verify,
            CallKind.FUSED: self._fused,
            CallKind.DECODE: self._decode,
            CallKind.PREFILL: self._prefill,
            CallKind.PREFILL_TOGETHER: self._prefill_together,
            CallKind.PROMPT_LOGITS: self._prompt_logits,
        }

    def graph(self, call: GraphCall) -> str:
        """The name of the graphs the call runs (logs, health)."""
        names = {CallKind.VERIFY: VERIFY, CallKind.FUSED: CHUNK_AND_DECODE, CallKind.DECODE: TOKEN_GENERATION,
                 CallKind.PROMPT_LOGITS: PROMPT_LOGITS}  # fmt: skip
        return names.get(call.kind, self.model.neuron_config.prefill_graph)

    def graph_calls(self, call: GraphCall) -> int:
        """How many times the call's graph has been called (a fused call may run as its two calls without it)."""
        return self.model.graph_set.calls[self.graph(call)]

    def run(self, call: GraphCall) -> StepResult:
        result = StepResult()
        self._run[call.kind](call, result)
        return result

    def _verify(self, call: GraphCall, result: StepResult) -> None:
        """Each row keeps its accepted drafts and one more token (spec_decode/bookkeeping.py)."""
        work = call.decodes
        states = [self.requests[w.req_id] for w in work]
        logits = self.model.verify(
            [s.slot for s in states],
            [[s.all_token_ids[w.start], *w.drafts] for s, w in zip(states, work, strict=True)],
            [w.start for w in work],
        )
        for state, tokens in zip(states, self.speculation.accept(states, work, logits), strict=True):
            result.tokens[state.req_id] = tokens

    def _decode(self, call: GraphCall, result: StepResult) -> None:
        """The decode batch; rows with drafts (a verify call's fallback) keep one token, every draft rejected."""
        states, processed, batch, bitmask = self._decode_inputs(call.decodes)
        decoded = self.model.decode(*batch, bitmask=bitmask)
        self.speculation.rejected(states, call.decodes)
        self._decoded(states, processed, decoded, result)

    def _fused(self, call: GraphCall, result: StepResult) -> None:
        """The decode batch and the first chunk(s) of one prompt slice (runtime.prefill_and_decode)."""
        (work,) = call.prefills
        state, tokens, began = self._prompt_slice(work)
        states, processed, batch, bitmask = self._decode_inputs(call.decodes)
        logits, decoded = self.model.prefill_and_decode(state.slot, tokens, work.start, *batch, bitmask=bitmask)
        self._prefilled(call, work, logits, began, result)
        self._decoded(states, processed, decoded, result)

    def _decode_inputs(self, work: tuple[ScheduledSlice, ...]):
        """(states, which rows are sampled on the host afterwards, the runtime's decode batch, the bitmask)."""
        states = [self.requests[w.req_id] for w in work]
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
        req_ids = [w.req_id for w in work]
        bitmask = constrained_bitmask(self.grammar.bitmask(req_ids, words), states, words) if on_device else None
        batch = (
            [s.slot for s in states],
            [s.all_token_ids[w.start] for s, w in zip(states, work, strict=True)],
            [w.start for w in work],
            [GREEDY if p else s.sampling for s, p in zip(states, processed, strict=True)],
            [None if p else s.generator for s, p in zip(states, processed, strict=True)],
        )
        return states, processed, batch, bitmask

    def _decoded(self, states: list[RequestState], processed: list[bool], decoded, result: StepResult) -> None:
        tokens = list(decoded.tokens)
        rows = [i for i, p in enumerate(processed) if p]
        if rows:
            if decoded.logits is None:
                raise RuntimeError(
                    "logits processing needs host logits; the platform should have rejected this request"
                )
            self.grammar.mask_host_logits(decoded.logits, [s.req_id for s in states])
            for i, token in zip(
                rows, self.host_sampler.sample(decoded.logits[rows], [states[i] for i in rows]), strict=True
            ):
                tokens[i] = token
        for i, state in enumerate(states):
            if state.wants_logprobs and decoded.logprobs is not None:
                result.logprobs[state.req_id] = device_token_logprobs(decoded.logprobs, i, state.params.logprobs)
            self._record(state, tokens[i], None if decoded.logits is None else decoded.logits[i], result)

    def _prefill(self, call: GraphCall, result: StepResult) -> None:
        (work,) = call.prefills
        state, tokens, began = self._prompt_slice(work)
        logits = self.model.prefill(state.slot, tokens, start=work.start)
        self._prefilled(call, work, logits, began, result)

    def _prefill_together(self, call: GraphCall, result: StepResult) -> None:
        """Chunk k of every slice in one call (runtime.prefill_batch)."""
        slices = [self._prompt_slice(work) for work in call.prefills]
        prompts = [(s.slot, tokens, w.start) for (s, tokens, _), w in zip(slices, call.prefills, strict=True)]
        logits = self.model.prefill_batch(prompts)
        for work, (_, _, began), row in zip(call.prefills, slices, logits, strict=True):
            self._prefilled(call, work, row, began, result, batched=True)

    def _prompt_logits(self, call: GraphCall, result: StepResult) -> None:
        """Every position's logits (runtime.prefill_positions), whose logprobs fill the request's prompt logprobs
        (prompt_logprobs.py)."""
        (work,) = call.prefills
        state, tokens, began = self._prompt_slice(work)
        logits = self.model.prefill_positions(state.slot, tokens, start=work.start)
        done = record_prompt_logprobs(state, logits, work.start)
        if done is not None:
            result.prompt_logprobs[work.req_id] = done
        self._prefilled(call, work, logits[-1], began, result)

    def _prompt_slice(self, work: ScheduledSlice) -> tuple[RequestState, list[int], float]:
        state = self.requests[work.req_id]
        return state, state.all_token_ids[work.start : work.start + work.count], time.perf_counter()

    def _prefilled(self, call, work: ScheduledSlice, logits, began: float, result: StepResult, batched=False) -> None:
        """The slice's figures; a complete prompt samples its first token on the host from the logits."""
        seconds, calls = time.perf_counter() - began, self.model.prefill_calls(work.count)
        result.prefilled.append(PrefillRecord(work.req_id, seconds, calls, call.interleaved, batched))
        state = self.requests[work.req_id]
        if work.start + work.count == state.num_tokens:
            self.grammar.mask_host_logits(logits[None], [state.req_id])
            self._record(state, self.host_sampler.sample(logits[None], [state])[0], logits, result)

    @staticmethod
    def _record(state: RequestState, token: int, logits, result: StepResult) -> None:
        result.tokens[state.req_id] = [token]
        if state.wants_logprobs and logits is not None:
            result.logprobs[state.req_id] = token_logprobs(logits, token, state.params.logprobs)
