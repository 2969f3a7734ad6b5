"""Speculative decoding's bookkeeping from step to step (the proposers and what is refused: spec_decode/methods.py).

Which decoding requests go in the verify call (split_verifies), what each keeps of its drafts (accept: the accepted
drafts and one more token, speculative.accept), each request's and all requests' acceptance (draft_gate.py,
verify_cost.py), and the drafts proposed after each step (propose), which vLLM collects with take_draft_token_ids
and schedules in the next step. Drafts are withheld from a request whose gate is closed, and from every request when
the step's drafts do not pay for the verify call they need (verify_cost.py): withheld drafts change no token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from vllm.config import VllmConfig
from vllm.v1.outputs import DraftTokenIds

from ...draft_acceptance import accept
from ...runtime import NeuronModelForCausalLM
from ...sampling import host_topk
from ..log import get_logger
from ..runner.request_state import RequestState
from ..runner.step_input import ScheduledSlice
from .draft_gate import DraftGate, min_acceptance
from .methods import make_drafter
from .verify_cost import NextRow, PooledRate, VerifyCosts

logger = get_logger(__name__)


class SpeculativeDecoding:
    def __init__(self, vllm_config: VllmConfig, model: NeuronModelForCausalLM) -> None:
        self.model = model
        self.drafter = make_drafter(vllm_config, model.neuron_config.batch_size)  # None without --speculative-config
        self.min_acceptance = min_acceptance() if self.drafter is not None else 0.0
        nc = model.neuron_config
        self.max_topk = host_topk(nc.on_device_sampling, nc.max_topk)  # the host's top-k rule, as for first tokens
        # Measured at warm-up unless ONP_SPECULATION_MIN_ACCEPTANCE=0 (then every draft is verified).
        self.verify_costs: VerifyCosts | None = None
        self.pooled_acceptance = PooledRate()  # a request's expected acceptance before its own first verify
        self._drafts: DraftTokenIds | None = None  # proposed after the last step, for take_draft_token_ids

    def speculates(self, state: RequestState) -> bool:
        """Drafts are proposed and verified only for requests whose tokens the plain sampler draws."""
        return (
            self.drafter is not None
            and state.params.structured_outputs is None
            and not state.wants_logprobs
            and not state.needs_logits_processing()
        )

    def split_verifies(
        self, decodes: list[ScheduledSlice], requests: dict[str, RequestState]
    ) -> tuple[list[ScheduledSlice], list[ScheduledSlice]]:
        """(the verify call's rows, the other decodes): when a request has drafts, every decode that may speculate
        goes in the verify call (a row without drafts verifies just its token), the rest decode as usual."""
        if not any(w.drafts for w in decodes):
            return [], decodes
        verifies = [w for w in decodes if self.speculates(requests[w.req_id])]
        if not any(w.drafts for w in verifies):
            return [], decodes
        return verifies, [w for w in decodes if w not in verifies]

    def accept(
        self, states: list[RequestState], work: Sequence[ScheduledSlice], logits: torch.Tensor
    ) -> list[list[int]]:
        """Each verified row's tokens: its accepted drafts and one more; counts the acceptance."""
        out = []
        for row, (state, w) in enumerate(zip(states, work, strict=True)):
            out.append(accept(logits[row], list(w.drafts), state.sampling, state.generator, self.max_topk))
        self._count(states, work, [len(tokens) - 1 for tokens in out])  # the last token is the model's own
        return out

    def rejected(self, states: list[RequestState], work: Sequence[ScheduledSlice]) -> None:
        """Rows decoded without their drafts (a failed verify call's fallback): every draft counts as rejected, as
        vLLM counts them when a row returns one token."""
        drafted = [(s, w) for s, w in zip(states, work, strict=True) if w.drafts]
        if drafted:
            self._count([s for s, _ in drafted], [w for _, w in drafted], [0] * len(drafted))

    def _count(self, states: list[RequestState], work: Sequence[ScheduledSlice], accepted: list[int]) -> None:
        """Each row's drafts and accepted drafts: its stats, its draft gate, the pooled acceptance."""
        for state, w, n in zip(states, work, accepted, strict=True):
            state.stats.draft_tokens += len(w.drafts)
            state.stats.accepted_tokens += n
            self._gate(state).verified(len(w.drafts), n)
        self.pooled_acceptance.verified(sum(len(w.drafts) for w in work), sum(accepted))

    def propose(self, sampled: dict[str, list[int]], requests: dict[str, RequestState]) -> None:
        """The proposer's drafts for every request that sampled this step and may speculate."""
        if self.drafter is None:
            return
        states = [requests[r] for r, tokens in sampled.items() if tokens and self.speculates(requests[r])]
        states = [s for s in states if self._gate(s).open()]
        drafts = self.drafter.propose([s.slot for s in states], [s.all_token_ids for s in states])
        if not self._drafts_pay(sampled, requests, dict(zip((s.req_id for s in states), drafts, strict=True))):
            drafts = [[] for _ in states]
        self._drafts = DraftTokenIds([s.req_id for s in states], drafts)

    def _drafts_pay(self, sampled, requests: dict[str, RequestState], drafts: dict[str, list[int]]) -> bool:
        """Whether next step's verify call is worth its cost (verify_cost.py), the requests that sampled this step
        decoding next."""
        if self.verify_costs is None:
            return True
        rows = []
        for req_id, tokens in sampled.items():
            if not tokens:
                continue
            state = requests[req_id]
            own = state.draft_gate.rate if state.draft_gate is not None else -1.0  # -1: not verified yet
            rate = own if own >= 0 else self.pooled_acceptance.rate
            rows.append(NextRow(state.num_tokens, len(drafts.get(req_id, ())), rate, self.speculates(state)))
        return self.verify_costs.drafts_pay(self.model, rows)

    def _gate(self, state: RequestState) -> DraftGate:
        if state.draft_gate is None:
            state.draft_gate = DraftGate(self.min_acceptance)
        return state.draft_gate

    def take(self) -> DraftTokenIds | None:
        """The drafts proposed after the last step (vLLM's engine stores them on its requests for the next)."""
        drafts, self._drafts = self._drafts, None
        return drafts

    def warm_up(self) -> None:
        """The proposer's graphs, and the verify and decode graphs' times when drafts are gated."""
        if self.drafter is None:
            return
        self.drafter.warm_up()
        if self.min_acceptance > 0:
            self.verify_costs = VerifyCosts.measure(self.model)
            logger.info(
                "speculative decoding: a verify call takes %s decode calls (per row count): drafts go to vLLM "
                "only when their expected accepted tokens pay for it",
                self.verify_costs.verify_over_decode(self.model),
            )
