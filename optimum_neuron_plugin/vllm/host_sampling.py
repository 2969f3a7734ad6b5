"""Host-side work on logits: min_tokens / min_p processing, sampling, logprobs.

Used for every first token (prefill logits) and, when the artifact has no on-device sampling,
for decode tokens too. Logprobs are vLLM's default "raw_logprobs": log_softmax of the model's
logits before any processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from vllm.v1.outputs import LogprobsLists

from ..sampling import sample_on_host
from .requests import RequestState


def process_logits(logits: torch.Tensor, state: RequestState) -> torch.Tensor:
    """logits [V] -> logits [V] with the request's min_tokens and min_p applied (a copy when changed)."""
    banned = state.banned_token_ids()
    min_p = state.params.min_p
    if not banned and min_p <= 0.0:
        return logits
    logits = logits.clone()
    if banned:
        logits[banned] = float("-inf")
    if min_p > 0.0 and not state.sampling.greedy:
        # p_i < min_p * p_max  <=>  l_i < l_max + T * ln(min_p), on temperature-scaled probabilities.
        threshold = logits.max() + state.sampling.temperature * math.log(min_p)
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    return logits


def sample_token(logits: torch.Tensor, state: RequestState, max_topk: int | None = None) -> int:
    """One token from logits [V] with the request's parameters and its own generator, over at most
    max_topk tokens (sampling.host_topk: the device's cap when the artifact samples on device)."""
    processed = process_logits(logits, state)
    return int(sample_on_host(processed[None], [state.sampling], [state.generator], max_topk)[0])


@dataclass(frozen=True)
class TokenLogprobs:
    token_ids: list[int]  # sampled token first, then the top-n
    logprobs: list[float]
    rank: int  # rank of the sampled token (1 = most likely)


def token_logprobs(logits: torch.Tensor, token: int, num_logprobs: int) -> TokenLogprobs:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    n = logprobs.numel() if num_logprobs < 0 else num_logprobs
    top = torch.topk(logprobs, n).indices.tolist() if n > 0 else []
    sampled = float(logprobs[token])
    rank = int((logprobs > sampled).sum()) + 1
    ids = [token, *top]
    return TokenLogprobs(ids, [float(logprobs[i]) for i in ids], rank)


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
