"""The decoder of every supported family (models.args.SUPPORTED_ARCHITECTURES) as static-shape tensor code.

One decoder, parametrized by ModelArgs: what differs between families (sliding-window layers with their own rope
base, Gemma's (1 + w) norms and sandwich norms, scaled embeddings, attention scale, activation, logit softcapping,
Granite's residual and logits scaling, SmolLM3's layers without rope, gpt-oss's attention sinks and YaRN rope, the
mixture-of-experts block in place of the MLP (models/moe.py)) is a field of ModelArgs, not a copy of this code. Checkpoints with fused projections (Phi-3) are split on load (models/checkpoint.py).

Weights are a flat dict named like the Hugging Face checkpoint, passed to every graph call
as inputs: compiled programs hold no weights, the artifact stores them once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import kv_cache, masks
from .args import ModelArgs
from .attention import attend, attend_chunk
from .collectives import SINGLE, Collectives
from .fp8 import SCALE_SUFFIX
from .layers import apply_rope, linear, mlp, rms_norm, rope_attention_factor, rope_cos_sin, rope_inv_freq
from .lora import LoraRows
from .masks import MASK_FILL
from .moe import moe, moe_weight_names
from .sharding import VOCAB_OFFSET

Params = dict[str, torch.Tensor]


def weight_names(args: ModelArgs) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not args.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        if args.sandwich_norms:
            names += [p + "pre_feedforward_layernorm.weight", p + "post_feedforward_layernorm.weight"]
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        names += moe_weight_names(args, p + "mlp.") if args.is_moe(i) else dense_mlp_names(p + "mlp.")
        if args.qkv_bias:
            names += [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
        if args.o_bias:
            names.append(p + "self_attn.o_proj.bias")
        if args.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        if args.attention_sinks:
            names.append(p + "self_attn.sinks")
    return names


def dense_mlp_names(prefix: str) -> list[str]:
    return [prefix + f"{x}_proj.weight" for x in ("gate", "up", "down")]


Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # input_ids, position_ids [n, T]; block tables [n, W]


def decoder_logits(
    args: ModelArgs,
    params: Params,
    caches: list[torch.Tensor],
    inv_freq: torch.Tensor,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    tables: torch.Tensor,
    bucket: int,
    cc: Collectives = SINGLE,
    chunk: bool = False,
) -> torch.Tensor:
    """Runs n rows of T tokens, writes their K/V into the blocks of their block tables [n, W], returns the fp32
    logits [n, vocab] of each row's last real token (the last column: padding repeats it).

    Only cache positions [0, bucket) are read. Rows attend them up to themselves (every position must be
    < bucket) or, with `chunk`, as prompt chunks: cache positions before the row's first position (which
    must be <= bucket) and their own tokens causally (models/masks.py).
    Under tensor parallelism (cc.degree > 1) `args` and `params` are one rank's shard (models/sharding.py)
    and the logits are that rank's vocabulary slice, padding columns filled with MASK_FILL."""
    groups = [(input_ids, position_ids, tables)]
    return groups_logits(args, params, caches, inv_freq, groups, bucket, cc, chunks=1 if chunk else 0)


def groups_logits(
    args: ModelArgs,
    params: Params,
    caches: list[torch.Tensor],
    inv_freq: torch.Tensor,
    groups: list[Rows],
    bucket: int,
    cc: Collectives = SINGLE,
    sliding_inv_freq: torch.Tensor | None = None,
    chunks: int = 0,
    every_column: bool = False,
    kernel_ops: bool = False,
    lora: LoraRows | None = None,
) -> torch.Tensor:
    """decoder_logits of several row groups in one pass over the weights, e.g. a prompt chunk [1, C] and a decode
    batch [B, 1] (chunk_and_decode): the linears and the MLP run on every group's tokens at once, attention per
    group. The groups must write distinct blocks. Returns the logits of each group's rows, in group order.

    Sliding-window layers rotate with `sliding_inv_freq` when the model gives them their own rope base. The first
    `chunks` groups are prompt chunks (decoder_logits' `chunk`). every_column: the logits of every token [tokens,
    vocab] in group order instead of each row's last (the verify and prompt_logits graphs). kernel_ops: prompt
    chunks attend through the op `onp::chunk_attention`, decode rows through `onp::decode_attention`
    (models/attention.py), norms, the dense MLPs' gated activation and the rotation run as `onp::rms_norm`,
    `onp::gated_activation` and `onp::rope` (models/layers.py), for a backend that has their kernels. lora: each
    group's rows' adapter slots, added to the projections that hold LoRA slots (models/lora.py)."""
    x = _cat([_embed(args, params, ids, cc).flatten(0, 1) for ids, _, _ in groups])[None]  # [1, tokens, hidden]
    positions = _cat([pos.flatten() for _, pos, _ in groups])[None]
    rope = {False: rope_cos_sin(positions, inv_freq, x.dtype, rope_attention_factor(args))}
    if args.has_sliding_layers:
        local = rope_inv_freq(args, sliding=True) if sliding_inv_freq is None else sliding_inv_freq
        rope[True] = rope_cos_sin(positions, local, x.dtype) if args.sliding_rope_theta else rope[False]
    calls = [
        _AttentionCall.of(args, caches[0], pos, tables, bucket, x.dtype, chunk=i < chunks, op=kernel_ops)
        for i, (_, pos, tables) in enumerate(groups)
    ]

    def norm(h: torch.Tensor, name: str) -> torch.Tensor:
        return rms_norm(h, params[name], args.rms_norm_eps, args.norm_offset, op=kernel_ops)

    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        sliding = args.is_sliding(i)
        h = norm(x, p + "input_layernorm.weight")
        layer_rope = rope[sliding] if args.uses_rope(i) else None
        h = _attention(
            args, params, p, h, layer_rope, caches[2 * i], caches[2 * i + 1], calls, sliding, cc, kernel_ops, lora
        )
        x = x + _residual(args, norm(h, p + "post_attention_layernorm.weight") if args.sandwich_norms else h)
        h = norm(
            x, p + ("pre_feedforward_layernorm.weight" if args.sandwich_norms else "post_attention_layernorm.weight")
        )
        h = _mlp(args, params, p + "mlp.", h, cc, i, kernel_ops, lora)
        x = x + _residual(args, norm(h, p + "post_feedforward_layernorm.weight") if args.sandwich_norms else h)
    last = norm(x[0] if every_column else _last_columns(x[0], groups), "model.norm.weight")
    head = params["model.embed_tokens.weight" if args.tie_word_embeddings else "lm_head.weight"]
    logits = linear(last, head).float()
    if args.logits_scaling != 1.0:
        logits = logits / args.logits_scaling
    if args.final_logit_softcapping:
        cap = args.final_logit_softcapping
        logits = torch.tanh(logits / cap) * cap
    if cc.degree == 1:
        return logits
    vocab_ids = params[VOCAB_OFFSET] + torch.arange(head.shape[0], dtype=torch.int32, device=logits.device)
    return logits.masked_fill(vocab_ids >= args.vocab_size, MASK_FILL)


def _mlp(
    args: ModelArgs,
    params: Params,
    prefix: str,
    h: torch.Tensor,
    cc: Collectives,
    layer: int,
    op: bool,
    lora: LoraRows | None = None,
) -> torch.Tensor:
    if args.is_moe(layer):
        return moe(args, params, prefix, h, cc)
    names = dense_mlp_names(prefix)
    scales = tuple(params.get(n + SCALE_SUFFIX) for n in names)
    adapt = None if lora is None else functools.partial(lora.apply, params)
    # Row-parallel down: each rank's LoRA delta is a partial sum too, added before the all-reduce.
    return cc.all_reduce(mlp(h, *(params[n] for n in names), args.hidden_act, scales, op, adapt, prefix))


def _residual(args: ModelArgs, h: torch.Tensor) -> torch.Tensor:
    return h if args.residual_multiplier == 1.0 else h * args.residual_multiplier


def _last_columns(x: torch.Tensor, groups: list[Rows]) -> torch.Tensor:
    """x [tokens, hidden] -> [rows, hidden]: each row's last column (padding repeats the last real token)."""
    lasts, start = [], 0
    for ids, _, _ in groups:
        n, t = ids.shape
        lasts.append(x[start : start + n * t].view(n, t, -1)[:, -1])
        start += n * t
    return _cat(lasts)


def _cat(tensors: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """torch.cat, without a copy for a single group (the graphs of one group keep their ops)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=dim)


@dataclass(frozen=True)
class _AttentionCall:
    """One row group's blocks and attention biases, computed once per call and shared by every layer."""

    rows: kv_cache.CallRows  # the rows' block tables and write slots
    bias: torch.Tensor  # full-attention layers: cache positions [0, bucket)
    shape: tuple[int, int]  # (n, T)
    sliding_bias: torch.Tensor | None = None  # sliding-window layers: the positions they read
    window: torch.Tensor | None = None  # their read (kv_cache.window_index) when shorter than the bucket
    chunk: bool = False  # prompt chunks: prior context + own causal block (attend_chunk)
    positions: torch.Tensor | None = None  # each row's positions
    op: bool = False  # through the ops onp::chunk_attention (prompt chunks) and onp::decode_attention (decode rows)

    @classmethod
    def of(cls, args: ModelArgs, cache, position_ids, tables, bucket, dtype, chunk=False, op=False) -> _AttentionCall:
        kv_groups = args.num_attention_heads // args.num_key_value_heads
        rows = kv_cache.CallRows.of(cache, tables, position_ids)
        shape, call = tuple(position_ids.shape), dict(positions=position_ids, op=op)
        if chunk:  # sliding layers read the whole prior bucket, masked to their window
            bias = masks.chunk_bias(position_ids, bucket, kv_groups, dtype)
            window = args.sliding_window if args.has_sliding_layers else None
            sliding = masks.chunk_bias(position_ids, bucket, kv_groups, dtype, window) if window else None
            return cls(rows, bias, shape, sliding, None, True, **call)
        bias = masks.attention_bias(position_ids, bucket, kv_groups, dtype)
        if not args.has_sliding_layers:
            return cls(rows, bias, shape, **call)
        window = args.sliding_window
        # A span of window - 1 positions before a row's first token through its last holds every key it attends.
        span = window - 1 + position_ids.shape[1]
        if span >= bucket:
            sliding = masks.attention_bias(position_ids, bucket, kv_groups, dtype, window)
            return cls(rows, bias, shape, sliding, **call)
        starts = masks.window_starts(position_ids, window, span, bucket)
        sliding = masks.attention_bias(position_ids, span, kv_groups, dtype, window, starts)
        index = kv_cache.window_index(cache, tables, starts, span)
        return cls(rows, bias, shape, sliding, index, **call)


def _embed(args: ModelArgs, params: Params, input_ids: torch.Tensor, cc: Collectives) -> torch.Tensor:
    """Embedding lookup; vocab-parallel under TP: each rank embeds the ids in its slice, zeros elsewhere, summed."""
    table = params["model.embed_tokens.weight"]
    if cc.degree == 1:
        x = table[input_ids]
    else:
        local = input_ids - params[VOCAB_OFFSET]  # int32: an embedding lookup takes int32 indices
        mine = (local >= 0) & (local < table.shape[0])
        x = cc.all_reduce(table[local.clamp(0, table.shape[0] - 1)] * mine[..., None].to(table.dtype))
    if args.embed_scale == 1.0:
        return x
    # The scale rounded to the weights' dtype first, as Hugging Face's Gemma does (sqrt(640) is 25.25 in bf16).
    return x * float(torch.tensor(args.embed_scale, dtype=table.dtype))


def _attention(
    args, params, p, h, rope, k_cache, v_cache, calls: list[_AttentionCall], sliding: bool, cc, ops: bool, lora=None
):
    """h [1, tokens, hidden]: every group's tokens in a row; each group attends its own cache rows."""
    tokens = h.shape[1]
    a = p + "self_attn."

    def adapted(name: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y if lora is None else lora.apply(params, a + name, x, y)

    q, k, v = (
        adapted(
            x, h, linear(h, params[a + x + ".weight"], params.get(a + x + ".bias"), params.get(a + x + ".weight_scale"))
        )
        for x in ("q_proj", "k_proj", "v_proj")
    )
    q = q.view(1, tokens, args.num_attention_heads, args.head_dim)
    k = k.view(1, tokens, args.num_key_value_heads, args.head_dim)
    v = v.view(1, tokens, args.num_key_value_heads, args.head_dim)
    if args.qk_norm:
        q = rms_norm(q, params[a + "q_norm.weight"], args.rms_norm_eps, args.norm_offset, op=ops)
        k = rms_norm(k, params[a + "k_norm.weight"], args.rms_norm_eps, args.norm_offset, op=ops)
    if rope is not None:
        q, k = apply_rope(q, *rope, op=ops), apply_rope(k, *rope, op=ops)
    outs, start = [], 0
    for call in calls:
        n, t = call.shape
        group = slice(start, start + n * t)
        qg, kg, vg = (x[:, group].reshape(n, t, *x.shape[2:]) for x in (q, k, v))
        bias, window = (call.sliding_bias, call.window) if sliding else (call.bias, None)
        sinks = params.get(a + "sinks")
        kv_scales = (params[a + "k_scale"], params[a + "v_scale"]) if a + "k_scale" in params else None
        if call.chunk:
            window_size = args.sliding_window if sliding else 0
            out = attend_chunk(
                qg, kg, vg, k_cache, v_cache, call.rows, bias, call.positions, window_size, args.attention_scale, sinks,
                kv_scales, op=call.op,
            )  # fmt: skip
        else:
            out = attend(
                qg, kg, vg, k_cache, v_cache, call.rows, bias, window, args.attention_scale, sinks, kv_scales,
                call.positions, op=call.op,
            )  # fmt: skip
        outs.append(out.reshape(1, n * t, -1))
        start += n * t
    out = _cat(outs, dim=1)
    o_scale = params.get(a + "o_proj.weight_scale")
    if cc.degree == 1:
        return adapted("o_proj", out, linear(out, params[a + "o_proj.weight"], params.get(a + "o_proj.bias"), o_scale))
    # Row-parallel: each rank's partial sum (its LoRA delta one too), then the bias once (an FP8 output scale is per
    # row: the same on every rank).
    out = cc.all_reduce(adapted("o_proj", out, linear(out, params[a + "o_proj.weight"], scale=o_scale)))
    bias = params.get(a + "o_proj.bias")
    return out if bias is None else out + bias
