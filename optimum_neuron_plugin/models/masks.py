"""The attention mask: which cache positions each query attends, as an additive bias with a finite fill.

Every graph writes its new K/V into the cache first, then attends cache positions [0, L) (L: the
graph's context bucket). A query at position p attends the positions <= p: the older context and its
own call's tokens up to itself.

This is also the actual-token mask of a padded chunk. A partial chunk is padded by repeating its last
real token and position, so a padded column writes the same K/V to the same cache position as the
last real token (a no-op) and, attending positions <= that position, sees exactly its keys. No padded
key exists, so none can be attended.
"""

from __future__ import annotations

import torch

# -1e9, never -inf or finfo(dtype).min: exp() of scores near the bf16 minimum gives NaN on Neuron,
# and -1e9 already underflows exp() to exactly 0 in fp32.
MASK_FILL = -1e9


def cache_mask(position_ids: torch.Tensor, bucket: int) -> torch.Tensor:
    """[n, T, L]: True where the query at position_ids[i, t] may attend cache position j (j <= position)."""
    cache_positions = torch.arange(bucket, dtype=position_ids.dtype, device=position_ids.device)  # int32, as positions
    return cache_positions[None, None, :] <= position_ids[:, :, None]


def attention_bias(position_ids: torch.Tensor, bucket: int, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """cache_mask as an additive bias [n, 1, groups*T, L] for queries laid out [n, kv_heads, groups*T, D]:
    0 where attended, a finite fill elsewhere. Built once per call and shared by every layer."""
    n, t = position_ids.shape
    mask = cache_mask(position_ids, bucket)
    mask = mask[:, None, None].expand(n, 1, groups, t, bucket).reshape(n, 1, groups * t, bucket)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, mask_fill(dtype))


def mask_fill(dtype: torch.dtype) -> float:
    """MASK_FILL where the dtype holds it (fp32, bf16), else half the dtype's minimum (fp16: -32752)."""
    return max(MASK_FILL, torch.finfo(dtype).min / 2)
