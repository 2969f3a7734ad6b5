"""Per-request state kept by the runner: its tokens, its vLLM block ids and its batch row (rows.py).

vLLM's scheduler does not send sampled tokens back to the worker, so the runner keeps each
request's tokens itself: prompt + every token it sampled. The runner appends sampled tokens to
`output_token_ids` (vLLM's logits processors hold that list); `all_token_ids` is one list that follows it,
extended by the tokens appended since its last read: a step costs O(its new tokens), not O(the context). Requests with
penalties keep their token counts over the vocabulary the same way (penalty_counts, sampling/penalties.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams as VllmSamplingParams
from vllm.v1.outputs import LogprobsTensors

from ...sampling import GREEDY, SamplingParams, make_generator
from ..sampling.penalties import PenaltyCounts, has_penalties
from ..spec_decode.draft_gate import DraftGate

_GREEDY_EPS = 1e-5  # vLLM treats temperature below this as greedy


@dataclass
class RequestStats:
    """Figures benchmarks read per request (see ModelRunner stats)."""

    prefill_calls: int = 0  # graph calls spent on this request's prompt (chunks)
    prefill_seconds: float = 0.0
    prefill_steps: int = 0  # engine steps that prefilled part of this request
    interleaved: bool = False  # a prefill step of this request also decoded other requests
    batched: bool = False  # its prompt was prefilled together with other prompts (runtime.prefill_batch)
    cached_tokens: int = 0  # tokens of vLLM's prefix-cache hit at admission (whole blocks): not prefilled
    draft_tokens: int = 0  # speculative decoding: draft tokens verified
    accepted_tokens: int = 0  # of which accepted


@dataclass
class RequestState:
    req_id: str
    prompt_token_ids: list[int]
    params: VllmSamplingParams
    sampling: SamplingParams  # what the graphs / host sampler get
    generator: torch.Generator | None  # None for greedy: greedy draws no randomness
    slot: int | None = None  # its batch row while it runs (rows.py)
    block_ids: list[int] = field(default_factory=list)  # vLLM's blocks of its positions, in order
    output_token_ids: list[int] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    prompt_logprobs: LogprobsTensors | None = None  # prompt_logprobs.py: filled slice by slice
    prompt_logprobs_sent: bool = False
    draft_gate: DraftGate | None = None  # speculative decoding: set by the runner on the first proposal
    penalty_counts: PenaltyCounts | None = None  # host sampling with penalties: set on the first sampled row
    lora_request: LoRARequest | None = None  # its LoRA adapter (lora_slots.py); None: the base model
    _token_ids: list[int] = field(default_factory=list, repr=False)  # all_token_ids as of its last read

    @classmethod
    def create(
        cls, req_id: str, prompt_token_ids: list[int], params: VllmSamplingParams, default_seed: int | None = None
    ) -> RequestState:
        """default_seed seeds an unseeded sampled request (SeedSource); None draws an OS seed."""
        sampling = to_runtime_sampling(params)
        seed = params.seed if params.seed is not None else default_seed
        generator = None if sampling.greedy else make_generator(seed)
        return cls(req_id, list(prompt_token_ids), params, sampling, generator)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output tokens: the same list on every read, extended in place (read it, do not modify it)."""
        held = len(self._token_ids) - len(self.prompt_token_ids)
        new = len(self.output_token_ids) - held
        if held < 0 or new < 0:  # first read, or the output was replaced by a shorter one
            self._token_ids = self.prompt_token_ids + self.output_token_ids
        elif new:
            self._token_ids.extend(self.output_token_ids[held:])
        return self._token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    def token_at(self, position: int) -> int:
        """The token at `position` (0 <= position < num_tokens) of prompt then output."""
        prompt = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < prompt else self.output_token_ids[position - prompt]

    @property
    def wants_logprobs(self) -> bool:
        return self.params.logprobs is not None

    def needs_logits_processing(self) -> bool:
        """Anything vLLM's sampler would change in this request's logits (host_sampling.HostSampler)."""
        return self.has_token_constraints() or self.has_value_processing() or self.has_penalties()

    def has_token_constraints(self) -> bool:
        """Tokens banned or allowed this step: a token bitmask row can carry them (token_constraints.py)."""
        p = self.params
        return len(self.output_token_ids) < p.min_tokens or bool(p.allowed_token_ids) or bool(p.bad_words_token_ids)

    def has_value_processing(self) -> bool:
        """min_p or logit_bias: the decode graphs' sampling inputs carry them (SamplingParams.min_p, logit_bias)."""
        return self.params.min_p > 0.0 or bool(self.params.logit_bias)

    def has_penalties(self) -> bool:
        """Repetition, frequency or presence penalties: they need the tokens so far, so host logits only."""
        return has_penalties(self.params)

    def counted_tokens(self, vocab: int) -> PenaltyCounts:
        """The request's prompt and output tokens over the vocabulary, counted up to its last token."""
        if self.penalty_counts is None:
            self.penalty_counts = PenaltyCounts.of_prompt(self.prompt_token_ids, vocab)
        self.penalty_counts.update(self.output_token_ids)
        return self.penalty_counts

    def continue_session(self, prompt_token_ids: list[int], params: VllmSamplingParams) -> None:
        """A streaming-input session's next input (vLLM 0.32 streaming input): the prompt is now the tokens so far
        (without the last sampled token, which the session drops) plus the new input, and the outputs start again.
        The random generator stays the request's."""
        self.prompt_token_ids, self.output_token_ids, self._token_ids = list(prompt_token_ids), [], []
        self.params, self.sampling = params, to_runtime_sampling(params)
        if self.sampling.greedy:
            self.generator = None
        elif self.generator is None:
            self.generator = make_generator(params.seed)
        self.prompt_logprobs, self.prompt_logprobs_sent = None, False
        self.penalty_counts = None  # counted again from the new prompt

    def resync(self, all_token_ids: list[int]) -> None:
        """Adopt the scheduler's token list (sent when a preempted request resumes)."""
        self.output_token_ids = list(all_token_ids[len(self.prompt_token_ids) :])
        self._token_ids = []
        self.penalty_counts = None


def to_runtime_sampling(params: VllmSamplingParams) -> SamplingParams:
    bias = tuple(params.logit_bias.items()) if params.logit_bias else ()
    if params.temperature < _GREEDY_EPS or params.top_k == 1:
        return SamplingParams(logit_bias=bias) if bias else GREEDY
    return SamplingParams(
        top_k=max(params.top_k, 0), top_p=params.top_p, temperature=params.temperature, min_p=params.min_p,
        logit_bias=bias,
    )  # fmt: skip


class SeedSource:
    """Seeds for unseeded sampled requests, drawn in admission order from the engine's --seed.

    vLLM's own runners sample unseeded requests from the global torch RNG seeded with --seed, so a
    server restarted with the same seed and the same requests samples the same tokens. Here each
    such request gets its own generator, seeded from this source when it is admitted: the same
    reproducibility, and a request's draws do not depend on its batch neighbours. seed None: OS seeds.
    """

    def __init__(self, seed: int | None) -> None:
        self._generator = None if seed is None else torch.Generator().manual_seed(seed)

    def next_seed(self) -> int | None:
        if self._generator is None:
            return None
        return int(torch.randint(0, 2**62, (1,), generator=self._generator))
