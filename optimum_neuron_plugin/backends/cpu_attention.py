"""The CPU kernels of the attention ops (models/attention.py): the same functions as their masked definitions,
computed over the keys the mask leaves and nothing else.

`onp::decode_attention` (decode rows on the cache in place): the definition attends the whole context bucket, where
every key past a row's last position is masked for every one of its queries; the kernel (C++,
csrc/decode_attention.cpp) reads each call row's cache positions [0, its last + 1) in place, under those columns of
the bias. A masked key weighs exactly 0 (exp of the -1e9 fill underflows in fp32), so the result changes by the
rounding of a shorter sum only.

`onp::chunk_attention` (prompt chunks):
The masked form runs PyTorch's CPU flash kernel over [the whole prior bucket | the own block] under the chunk's
bias: a masked key costs what a live one does, and adding the bias to every score costs more (docs/attention-split.md).
Here each row runs two flash calls: its prior, cache positions [low, start) read in place (a view of the cache,
nothing copied), without a mask unless the layer slides (then under the bias's columns for those positions); and its
own block, causal over its real keys (the kernel's causal form skips the upper triangle; padded queries, past the
last real key, see every real key as the mask has it), or under the bias's own columns in a sliding layer. The two
partial softmaxes merge by their log-sum-exp (the flash kernel
returns it): o = o_own + (o_prior - o_own) * sigmoid(lse_prior - lse_own). A key the bias masks for every query
weighs exactly 0 in the masked form (exp of the -1e9 fill underflows), so leaving it out changes the result by the
rounding of a different summation order only (tests/core/test_chunk_kernel.py). An attention sink is one more
term of the softmax's sum with no value: it scales the output by sigmoid(lse - sink).
"""

from __future__ import annotations

import torch

from ..models.attention import chunk_attention, decode_attention
from . import cpu_kernels

cpu_kernels.load()
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_decode = torch.ops.onp_cpu.decode_attention.default


def chunk_attention_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_ids: torch.Tensor,
    positions: torch.Tensor,
    bias: torch.Tensor,
    window: int,
    scale: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    n, t, heads, dim = q.shape
    kv_heads = k.shape[2]
    groups = heads // kv_heads
    prior = bias.shape[-1] - t
    # GQA without repeating K/V: queries as [n, KVH, G*T, D], as the masked form lays them out.
    queries = q.view(n, t, kv_heads, groups, dim).permute(0, 2, 3, 1, 4).reshape(n, kv_heads, groups * t, dim)
    own_keys, own_values = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    sink_logits = None
    if sinks is not None:  # [KVH, G*T, 1]: head h's sink for each of its queries, rounded like the bias
        sink_logits = sinks.to(bias.dtype).float().view(kv_heads, groups, 1).expand(-1, -1, t).reshape(-1, groups * t)
    outs = []
    for i, (row, (start, last)) in enumerate(zip(seq_ids.tolist(), positions[:, [0, -1]].tolist(), strict=True)):
        qi = queries[i : i + 1]
        if window:
            own = bias[i : i + 1, ..., prior:]
            out, lse = _flash(qi, own_keys[i : i + 1], own_values[i : i + 1], attn_mask=own, scale=scale)
        else:
            out, lse = _own_causal(qi, own_keys[i : i + 1], own_values[i : i + 1], last - start + 1, scale)
        end = min(start, prior)
        low = max(0, start - window + 1) if window else 0
        if end > low:
            mask = bias[i : i + 1, ..., low:end] if window else None
            keys, values = k_cache[row : row + 1, :, low:end], v_cache[row : row + 1, :, low:end]
            out_prior, lse_prior = _flash(qi, keys, values, attn_mask=mask, scale=scale)
            weight = torch.sigmoid(lse_prior - lse).unsqueeze(-1)
            out = torch.lerp(out.float(), out_prior.float(), weight).to(q.dtype)
            lse = torch.logaddexp(lse, lse_prior)
        if sink_logits is not None:
            out = (out.float() * torch.sigmoid(lse - sink_logits).unsqueeze(-1)).to(q.dtype)
        outs.append(out)
    out = torch.cat(outs) if n > 1 else outs[0]  # [n, KVH, G*T, D]
    return out.view(n, kv_heads, groups, t, dim).permute(0, 3, 1, 2, 4).reshape(n, t, heads * dim)


def _own_causal(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, real: int, scale: float | None):
    """One row's own block without a window: queries [1, KVH, G*T, D] against its first `real` keys [1, KVH, T, D],
    causally. As heads [1, H, T, D] (a view) against K/V repeated per group (a chunk's own keys: small), where the
    kernel's causal form applies: query t sees keys u <= t, every real key from the last real query on."""
    _, kv_heads, rows, dim = queries.shape
    groups = rows // keys.shape[2]
    heads = queries.view(1, kv_heads * groups, rows // groups, dim)
    keys = keys[:, :, :real].repeat_interleave(groups, dim=1)
    values = values[:, :, :real].repeat_interleave(groups, dim=1)
    out, lse = _flash(heads, keys, values, is_causal=True, scale=scale)
    return out.view(1, kv_heads, rows, dim), lse.reshape(1, kv_heads, rows)


def decode_attention_cpu(
    q: torch.Tensor,
    bias: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_ids: torch.Tensor,
    positions: torch.Tensor,
    scale: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    return _decode(q, bias, k_cache, v_cache, seq_ids, positions, scale, sinks)


chunk_attention.register_kernel("cpu")(chunk_attention_cpu)
decode_attention.register_kernel("cpu")(decode_attention_cpu)
