"""The attention masks: which keys each query attends, as additive biases with a finite fill.

Two layouts, both built once per call and shared by every layer:

- cache_mask / attention_bias (decode rows, context_encoding): the graph writes its new K/V into the cache,
  then attends cache positions [0, L) (L: the graph's context bucket). A query at position p attends the
  positions <= p: the older context and its own call's tokens up to itself.
- chunk_mask / chunk_bias (prompt chunks): a chunk at positions [start, start + T) attends the keys
  [cache positions 0..P-1 | its own T new keys] (P: the graph's prior bucket, P >= start). Cache position j is
  attended iff j < start (a key-length mask, the same for every query: no causal mask inside), own key u by
  own query t iff u <= t and u is a real token. One softmax over both pieces is the log-sum-exp merge of the
  two partial softmaxes (models/attention.py).

A sliding-window layer (window W) also drops positions <= p - W, as Hugging Face does. When the graph's
bucket is longer than the window, such a layer reads only a span of the cache that holds every key its
queries attend: W - 1 positions before the row's first token through its last (window_starts). In the chunk
layout it reads the whole prior bucket, masked to the window.

Padding: a partial chunk is padded by repeating its last real token and position. In the cache layout a padded
column writes the same K/V to the same position as the last real token (a no-op) and, attending positions <= that
position, sees exactly its keys. In the chunk layout a padded own key is a duplicate of the last real one: it is
masked (its position is not start + its column), so a padded query sees exactly the last real token's keys.
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


def chunk_mask(position_ids: torch.Tensor, prior: int, window: int | None = None) -> torch.Tensor:
    """[n, T, prior + T]: True where own query t of row i may attend key k of [cache 0..prior-1 | own 0..T-1].

    Row i's chunk starts at position_ids[i, 0]; its real tokens are the columns u with position start + u. With a
    window, a query at position p also drops keys at positions <= p - window."""
    n, t = position_ids.shape
    start = position_ids[:, :1]  # [n, 1]
    columns = torch.arange(t, dtype=position_ids.dtype, device=position_ids.device)
    real = (position_ids - start) == columns  # [n, T]: own key u holds a real token
    causal = columns[None, :] <= columns[:, None]  # [T, T]: own key u <= own query t
    own = causal[None] & real[:, None, :]
    queries = position_ids[:, :, None]
    if window:
        own = own & (position_ids[:, None, :] > queries - window)
    if prior == 0:
        return own
    keys = torch.arange(prior, dtype=position_ids.dtype, device=position_ids.device)[None, None, :]
    older = (keys < start[:, :, None]).expand(n, t, prior)  # [n, T, prior]
    if window:
        older = older & (keys > queries - window)
    return torch.cat((older, own), dim=-1)


def window_starts(position_ids: torch.Tensor, window: int, span: int, bucket: int) -> torch.Tensor:
    """[n], the positions' dtype: the first cache position of each row's sliding-window read of `span` positions,
    within [0, bucket).

    Row i's queries (positions position_ids[i, 0] onwards) attend keys after position_ids[i, 0] - window."""
    return (position_ids[:, 0] - (window - 1)).clamp(0, bucket - span)


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
    return _as_bias(cache_mask(position_ids, bucket, window, starts), groups, dtype)


def chunk_bias(
    position_ids: torch.Tensor, prior: int, groups: int, dtype: torch.dtype, window: int | None = None
) -> torch.Tensor:
    """chunk_mask as an additive bias [n, 1, groups*T, prior + T] (queries laid out as in attention_bias)."""
    return _as_bias(chunk_mask(position_ids, prior, window), groups, dtype)


def _as_bias(mask: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    n, t, keys = mask.shape
    mask = mask[:, None, None].expand(n, 1, groups, t, keys).reshape(n, 1, groups * t, keys)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, mask_fill(dtype))


def mask_fill(dtype: torch.dtype) -> float:
    """MASK_FILL where the dtype holds it (fp32, bf16), else half the dtype's minimum (fp16: -32752)."""
    return max(MASK_FILL, torch.finfo(dtype).min / 2)
