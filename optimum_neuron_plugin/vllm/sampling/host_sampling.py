"""Host-side work on logits, with vLLM's own pieces: logits processing, then the plugin's draw, then logprobs.

Used for every first token (prefill logits) and, when the artifact has no on-device sampling, for
decode tokens too. Processing is vLLM's V1 sampler, in its order (vllm/v1/sample/sampler.py):
allowed_token_ids, bad_words, min_tokens and logit_bias (its builtin logits processors), the
repetition / frequency / presence penalties (vLLM's formulas over token counts each request keeps: penalties.py),
then min_p on temperature-scaled logits. The draw itself stays the plugin's top-k / top-p sampler
(sampling.sample_on_host), the same algorithm as the on-device sampler, so a seeded request draws
the same tokens whether a step runs on the host or on the device. Logprobs are vLLM's default
"raw_logprobs" (log_softmax of the model's logits before any processing), gathered as vLLM's Sampler does
(compat.gather_logprobs); tokens sampled on the device come with the same logprobs from the decode graph
(device_token_logprobs). vLLM's private pieces are reached through compat.py.

Under tensor parallelism every rank samples the same logits, and rank 0's tokens are the ones every rank records
(runtime.ranks.from_rank0, as the decode graphs' host-drawn uniforms are): a draw that differed on one rank (logits
that differ in their last bits, a generator in another state) would make the ranks' sequences diverge.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from vllm.config import VllmConfig
from vllm.v1.outputs import LogprobsLists

from ...runtime.decode import SampledLogprobs
from ...runtime.ranks import from_rank0
from ...sampling import sample_on_host
from ..compat import LogitsProcessing, gather_logprobs, raw_logprobs
from ..runner.request_state import RequestState
from .penalties import apply_penalties


class HostSampler:
    """Samples rows of logits on the host for the requests that own them (one row per request)."""

    def __init__(
        self, vllm_config: VllmConfig, max_topk: int | None = None, group: dist.ProcessGroup | None = None
    ) -> None:
        self.max_topk = max_topk  # at most this many tokens are candidates (None: the whole vocabulary)
        self.group = group  # the tensor-parallel ranks (None: one rank)
        self._processing = LogitsProcessing(vllm_config)

    def sample(self, logits: torch.Tensor, states: list[RequestState]) -> list[int]:
        """logits [n, V] -> one token per request, with its parameters and its own generator (rank 0's tokens)."""
        processed = self.process(logits, states)
        sampling, generators = [s.sampling for s in states], [s.generator for s in states]
        return from_rank0(self.group, sample_on_host(processed, sampling, generators, self.max_topk)).tolist()

    def process(self, logits: torch.Tensor, states: list[RequestState]) -> torch.Tensor:
        """logits [n, V] -> logits [n, V] with every request's processing applied (a copy when changed)."""
        if not any(s.needs_logits_processing() for s in states):
            return logits
        logits = logits.float().clone()
        params = [s.params for s in states]
        self._processing.set_rows([(s.params, s.prompt_token_ids, s.output_token_ids) for s in states])
        mask = _allowed_token_ids_mask(params, logits.shape[-1])
        logits = self._processing.apply(logits, params, [s.output_token_ids for s in states], mask)
        vocab = logits.shape[-1]
        counts = [s.counted_tokens(vocab) if s.has_penalties() else None for s in states]
        apply_penalties(logits, params, counts)
        return self._apply_min_p(logits, states)

    def _apply_min_p(self, logits: torch.Tensor, states: list[RequestState]) -> torch.Tensor:
        """vLLM's argmax-invariant processors (min_p) see temperature-scaled logits, as in Sampler.sample."""
        if not any(s.params.min_p > 0 and not s.sampling.greedy for s in states):
            return logits
        temperature = torch.tensor([1.0 if s.sampling.greedy else s.sampling.temperature for s in states])
        scaled = logits / temperature[:, None]
        scaled = self._processing.apply_after_temperature(scaled)
        return logits.masked_fill(torch.isneginf(scaled), float("-inf"))


def _allowed_token_ids_mask(params: list, vocab: int) -> torch.Tensor | None:
    """vLLM's mask convention: True where the logit is set to -inf."""
    if not any(p.allowed_token_ids for p in params):
        return None
    mask = torch.zeros(len(params), vocab, dtype=torch.bool)
    for i, p in enumerate(params):
        if p.allowed_token_ids:
            mask[i] = True
            mask[i, p.allowed_token_ids] = False
    return mask


@dataclass(frozen=True)
class TokenLogprobs:
    token_ids: list[int]  # sampled token first, then the top-n
    logprobs: list[float]
    rank: int  # rank of the sampled token (1 = most likely)


def token_logprobs(logits: torch.Tensor, token: int, num_logprobs: int) -> TokenLogprobs:
    """Raw logprobs of logits [V] for the sampled token and the top num_logprobs (-1: the whole vocabulary)."""
    logprobs = raw_logprobs(logits[None])
    n = logprobs.shape[-1] if num_logprobs < 0 else num_logprobs
    gathered = gather_logprobs(logprobs, n, torch.tensor([token]))
    return TokenLogprobs(
        gathered.logprob_token_ids[0].tolist(), gathered.logprobs[0].tolist(), int(gathered.selected_token_ranks[0])
    )


def device_token_logprobs(sampled: SampledLogprobs, row: int, num_logprobs: int) -> TokenLogprobs:
    """The decode graph's raw logprobs of one row, cut to the request's num_logprobs (request_checks: at most the
    graph's max_logprobs)."""
    width = 1 + num_logprobs
    return TokenLogprobs(
        sampled.token_ids[row, :width].tolist(), sampled.logprobs[row, :width].tolist(), int(sampled.ranks[row])
    )


def logprobs_lists(rows: list[TokenLogprobs | None]) -> LogprobsLists | None:
    """One row per request of the step (ModelRunnerOutput order); None rows are fillers."""
    if all(row is None for row in rows):
        return None
    width = max(len(row.token_ids) for row in rows if row is not None)
    token_ids = np.zeros((len(rows), width), dtype=np.int64)
    values = np.zeros((len(rows), width), dtype=np.float32)
    ranks = np.zeros(len(rows), dtype=np.int64)
    for i, row in enumerate(rows):
        if row is not None:
            token_ids[i, : len(row.token_ids)] = row.token_ids
            values[i, : len(row.logprobs)] = row.logprobs
            ranks[i] = row.rank
    return LogprobsLists(token_ids, values, ranks)
