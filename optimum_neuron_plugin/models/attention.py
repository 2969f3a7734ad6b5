"""Attention of the active tokens against the cached prior context and themselves, with GQA."""

from __future__ import annotations

import torch

from . import kv_cache
from .masks import MASK_FILL

# Scores more than this below a row's maximum weigh exp(-80) ~ 1e-35: nothing in fp32 next to the maximum's 1.
MIN_EXP_ARG = -80.0


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax in fp32 over the last dim; masked entries weigh exactly 0.

    The row maximum is taken over real scores (masked ones filled with the finite MASK_FILL, see
    masks.py), then exp() only ever sees arguments in [MIN_EXP_ARG, 0]: the CPU's exp takes a 3x
    slower path on huge negative arguments such as the fill, and nothing overflows. A row with
    nothing to attend gets zero weights, not NaN.
    """
    scores = scores.float()
    top = scores.masked_fill(~mask, MASK_FILL).amax(dim=-1, keepdim=True)
    weights = (scores - top).clamp(MIN_EXP_ARG, 0.0).exp() * mask
    return weights / weights.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)


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

    prior [n, 1, L] masks the cached keys of positions [0, L) (L: the graph's context bucket),
    active [n, T, T] the keys of this call. Prior and active keys are scored separately so cache
    rows are never concatenated (copied).

    A call with one row per cache row (token_generation) puts its rows in slot order and attends
    the whole cache in place, so no cache row is copied; other calls read copies of their rows.
    """
    bucket = prior.shape[-1]
    if q.shape[0] == k_cache.shape[0]:
        slotted = [_to_slots(x, seq_ids, fill) for x, fill in ((q, 0), (k, 0), (v, 0), (prior, 0), (active, 1))]
        out = _attend_rows(*slotted, kv_cache.all_rows(k_cache, bucket), kv_cache.all_rows(v_cache, bucket))
        out = out.index_select(0, seq_ids)
    else:
        prior_k, prior_v = kv_cache.read(k_cache, seq_ids, bucket), kv_cache.read(v_cache, seq_ids, bucket)
        out = _attend_rows(q, k, v, prior, active, prior_k, prior_v)
    kv_cache.write(k_cache, seq_ids, position_ids, k)
    kv_cache.write(v_cache, seq_ids, position_ids, v)
    return out


def _to_slots(x: torch.Tensor, seq_ids: torch.Tensor, fill: int) -> torch.Tensor:
    """Row i of x moved to row seq_ids[i]. Padding rows repeat row 0 (same slot, same values), and
    slots without a row get `fill`: an empty slot attends only its own (zero) key, never nothing."""
    return torch.full_like(x, fill).index_copy(0, seq_ids.long(), x)


def _attend_rows(q, k, v, prior, active, prior_k, prior_v) -> torch.Tensor:
    n, t, heads, dim = q.shape
    kv_heads = k.shape[2]
    groups = heads // kv_heads
    # GQA without repeating K/V: queries as [n, KVH, G*T, D] against keys [n, KVH, L or T, D].
    qg = q.view(n, t, kv_heads, groups, dim).permute(0, 2, 3, 1, 4).reshape(n, kv_heads, groups * t, dim)
    active_k, active_v = k.transpose(1, 2), v.transpose(1, 2)
    scale = dim**-0.5
    scores = torch.cat((qg @ prior_k.transpose(-1, -2), qg @ active_k.transpose(-1, -2)), dim=-1) * scale
    mask = torch.cat((prior.expand(n, t, -1), active), dim=-1)  # [n, T, L+T]
    mask = mask[:, None, None].expand(n, 1, groups, t, -1).reshape(n, 1, groups * t, -1)
    weights = masked_softmax(scores, mask).to(q.dtype)
    length = prior_k.shape[2]
    out = weights[..., :length] @ prior_v + weights[..., length:] @ active_v  # [n, KVH, G*T, D]
    return out.view(n, kv_heads, groups, t, dim).permute(0, 3, 1, 2, 4).reshape(n, t, heads * dim)
