"""Attention of the active tokens against the cached prior context and themselves, with GQA."""

from __future__ import annotations

import torch

from . import kv_cache
from .masks import MASK_FILL


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax in fp32 over the last dim with masked scores filled with MASK_FILL (see masks.py)."""
    scores = scores.float().masked_fill(~mask, MASK_FILL)
    scores = scores - scores.amax(dim=-1, keepdim=True)
    weights = scores.exp()
    return weights / weights.sum(dim=-1, keepdim=True)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_ids: torch.Tensor,
    position_ids: torch.Tensor,
    prior: torch.Tensor,
    active: torch.Tensor,
) -> torch.Tensor:
    """q [n, T, H, D], k/v [n, T, KVH, D] -> [n, T, H*D]; then writes k/v into the cache rows of seq_ids.

    prior [n, 1, S] masks the cached keys, active [n, T, T] the keys of this call. Prior and
    active keys are scored separately so the cache rows are never concatenated (copied).
    """
    n, t, heads, dim = q.shape
    kv_heads = k.shape[2]
    groups = heads // kv_heads
    # GQA without repeating K/V: queries as [n, KVH, G*T, D] against keys [n, KVH, S or T, D].
    qg = q.view(n, t, kv_heads, groups, dim).permute(0, 2, 3, 1, 4).reshape(n, kv_heads, groups * t, dim)
    prior_k, prior_v = kv_cache.read(k_cache, seq_ids), kv_cache.read(v_cache, seq_ids)
    active_k, active_v = k.transpose(1, 2), v.transpose(1, 2)
    scale = dim**-0.5
    scores = torch.cat((qg @ prior_k.transpose(-1, -2), qg @ active_k.transpose(-1, -2)), dim=-1) * scale
    mask = torch.cat((prior.expand(n, t, -1), active), dim=-1)  # [n, T, S+T]
    mask = mask[:, None, None].expand(n, 1, groups, t, -1).reshape(n, 1, groups * t, -1)
    weights = masked_softmax(scores, mask).to(q.dtype)
    length = prior_k.shape[2]
    out = weights[..., :length] @ prior_v + weights[..., length:] @ active_v  # [n, KVH, G*T, D]
    kv_cache.write(k_cache, seq_ids, position_ids, k)
    kv_cache.write(v_cache, seq_ids, position_ids, v)
    return out.view(n, kv_heads, groups, t, dim).permute(0, 3, 1, 2, 4).reshape(n, t, heads * dim)
