"""The attention mask: which cache positions each query attends, as an additive bias with a finite fill.

Every graph writes its new K/V into the cache first, then attends cache positions [0, L) (L: the
graph's context bucket). A query at position p attends the positions <= p: the older context and its
own call's tokens up to itself.

A sliding-window layer (window W) also drops positions <= p - W, as Hugging Face does. When the graph's
bucket is longer than the window, such a layer reads only a span of the cache that holds every key its
queries attend: W - 1 positions before the row's first token through its last (window_starts).

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


def cache_mask(
    position_ids: torch.Tensor, bucket: int, window: int | None = None, starts: torch.Tensor | None = None
) -> torch.Tensor:
    """[n, T, L]: True where the query at position_ids[i, t] may attend the key read at j, cache position
    starts[i] + j (j without starts): at most its own position and, with a window, after position - window."""
    keys = torch.arange(bucket, dtype=position_ids.dtype, device=position_ids.device)[
        None, None, :
    ]  # int32, as positions
    if starts is not None:
        keys = keys + starts[:, None, None].to(keys.dtype)
    queries = position_ids[:, :, None]
    mask = keys <= queries
    return mask & (keys > queries - window) if window else mask


def window_starts(position_ids: torch.Tensor, window: int, span: int, bucket: int) -> torch.Tensor:
    """[n] int64: the first cache position of each row's sliding-window read of `span` positions, within [0, bucket).

    Row i's queries (positions position_ids[i, 0] onwards) attend keys after position_ids[i, 0] - window."""
    return (position_ids[:, 0].long() - (window - 1)).clamp(0, bucket - span)


def attention_bias(
    position_ids: torch.Tensor,
    bucket: int,
    groups: int,
    dtype: torch.dtype,
    window: int | None = None,
    starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """cache_mask as an additive bias [n, 1, groups*T, L] for queries laid out [n, kv_heads, groups*T, D]:
    0 where attended, a finite fill elsewhere. Built once per call and shared by every layer."""
    n, t = position_ids.shape
    mask = cache_mask(position_ids, bucket, window, starts)
    mask = mask[:, None, None].expand(n, 1, groups, t, bucket).reshape(n, 1, groups * t, bucket)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, mask_fill(dtype))


def mask_fill(dtype: torch.dtype) -> float:
    """MASK_FILL where the dtype holds it (fp32, bf16), else half the dtype's minimum (fp16: -32752)."""
    return max(MASK_FILL, torch.finfo(dtype).min / 2)
