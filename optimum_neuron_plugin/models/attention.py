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

    prior [n, 1, S] masks cached keys, active [n, T, T] the keys of this call.
    """
    n, t, heads, dim = q.shape
    kv_heads = k.shape[2]
    groups = heads // kv_heads
    prior_k, prior_v = kv_cache.read(k_cache, seq_ids), kv_cache.read(v_cache, seq_ids)
    # [n, KVH, G, T, D] queries against [n, KVH, 1, S+T, D] keys: GQA without repeating K/V.
    qg = q.view(n, t, kv_heads, groups, dim).permute(0, 2, 3, 1, 4)
    keys = torch.cat((prior_k, k), dim=1).permute(0, 2, 1, 3)[:, :, None]
    values = torch.cat((prior_v, v), dim=1).permute(0, 2, 1, 3)[:, :, None]
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * dim**-0.5
    mask = torch.cat((prior.expand(n, t, -1), active), dim=-1)[:, None, None]
    weights = masked_softmax(scores, mask).to(q.dtype)
    out = torch.matmul(weights, values)  # [n, KVH, G, T, D]
    kv_cache.write(k_cache, seq_ids, position_ids, k)
    kv_cache.write(v_cache, seq_ids, position_ids, v)
    return out.permute(0, 3, 1, 2, 4).reshape(n, t, heads * dim)
