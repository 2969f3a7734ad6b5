"""Top-k / top-p / temperature sampling as tensor ops, with the randomness given as an input.

The graph holds no RNG op: `uniform` [n, 1] is drawn on the host from each request's own
generator, so a seeded request samples the same tokens on any backend.
"""

from __future__ import annotations

import torch

from .masks import MASK_FILL


def sample(logits: torch.Tensor, params: torch.Tensor, uniform: torch.Tensor, max_topk: int) -> torch.Tensor:
    """logits [n, V], params [n, 3] = (top_k, top_p, temperature), uniform [n, 1] in [0, 1) -> token ids [n].

    top_k is clamped to [1, max_topk]; greedy is top_k 1 (rank 0 is the argmax).
    """
    k = min(max_topk, logits.shape[-1])
    top_values, top_ids = torch.topk(logits.float(), k, dim=-1)
    top_k, top_p, temperature = params[:, 0:1], params[:, 1:2], params[:, 2:3]
    ranks = torch.arange(k, device=logits.device)[None, :]
    scaled = (top_values / temperature).masked_fill(ranks >= top_k, MASK_FILL)
    probs = torch.softmax(scaled, dim=-1)
    # Running sums as a matmul with a triangular matrix, not torch.cumsum (neuronx-cc has a history of
    # cumsum failures): upper[i, j] = 1 where i <= j, so (p @ upper)[j] = p[0] + ... + p[j].
    upper = (ranks >= ranks.T).float()
    # Keep a rank while the mass strictly before it is below top_p: rank 0 is always kept.
    keep = (probs @ upper - probs) < top_p
    probs = probs * keep
    cdf = probs @ upper
    choice = (cdf < uniform * cdf[:, -1:]).sum(dim=-1, keepdim=True).clamp(max=k - 1)
    return top_ids.gather(-1, choice).squeeze(-1)
