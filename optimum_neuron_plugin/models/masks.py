"""Attention masks for a batch of n rows of T query tokens against S cached and T active keys.

True means "may attend". Masked scores are filled with MASK_FILL before an fp32 softmax.
"""

from __future__ import annotations

import torch

# -1e9, never finfo(dtype).min: exp() of scores near the bf16 minimum gives NaN on Neuron,
# and -1e9 already underflows exp() to exactly 0 in fp32.
MASK_FILL = -1e9


def actual_token_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """[n, T]: column j is a real token while positions strictly increase (j == 0 or pos[j] > pos[j-1]).

    A partial chunk is padded by repeating its last real token and position. Padded columns are
    masked out as keys, so every padded query attends exactly the keys of the last real token:
    its K/V equal the last real token's and its duplicate write into the cache is a no-op.
    """
    first = torch.ones_like(position_ids[:, :1], dtype=torch.bool)
    rising = position_ids[:, 1:] > position_ids[:, :-1]
    return torch.cat((first, rising), dim=1)


def active_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """[n, T, T]: causal within the active tokens, ANDed with the actual-token mask of the keys."""
    t = position_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=position_ids.device).tril()
    return causal[None] & actual_token_mask(position_ids)[:, None, :]


def prior_mask(position_ids: torch.Tensor, bucket: int) -> torch.Tensor:
    """[n, 1, L]: cached positions [0, L) strictly before this call's first position (older context only)."""
    cache_positions = torch.arange(bucket, device=position_ids.device)
    return cache_positions[None, None, :] < position_ids[:, :1, None]
