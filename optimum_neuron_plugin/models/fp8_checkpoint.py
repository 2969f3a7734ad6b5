"""FP8 checkpoints read by their tensor names, and the rule of which weights the artifact keeps in FP8.

Three formats, told apart by config.json's quantization_config.quant_method:
- "fp8" (transformers' FineGrainedFP8, the Qwen3 / DeepSeek FP8 releases): `<linear>.weight` float8_e4m3fn and
  `<linear>.weight_scale_inv` [ceil(out / bn), ceil(in / bk)] for weight_block_size [bn, bk], or a per-tensor
  `<linear>.weight_scale` without blocks;
- "compressed-tensors" (llm-compressor), float weights of 8 bits: `<linear>.weight_scale` per tensor ([1]), per
  channel ([out, 1]) or per block (strategy "block", block_structure [bn, bk]);
- "modelopt" (NVIDIA ModelOpt, quant_algo FP8): per-tensor `<linear>.weight_scale` and `input_scale`, optional
  `k_proj.k_scale` / `v_proj.v_scale`.
A weight's value is its fp8 value times its scale (vLLM's scaled_dequantize). Scales are kept exactly: per-tensor
ones expanded to every output channel (vLLM's convert_to_channelwise), block ones expanded over their rows to
[out, in / 128]; each projection keeps its own, so fused shards never need requantizing to one. Activation scales
(input_scale) are dropped: the graphs are weight-only FP8 and run activations in the model dtype.
"""

from __future__ import annotations

import re

import torch

from . import fp8
from .args import ModelArgs

FORMATS = ("fp8", "compressed-tensors", "modelopt")
# The linears whose weights the artifact stores in FP8; everything else (embeddings, lm_head, norms, biases, MoE
# routers and experts) stays in the model dtype.
QUANTIZED_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KV_SCALE = re.compile(r"^(model\.layers\.\d+\.self_attn)\.(?:[kv]_proj\.|qkv_proj\.)?([kv]|kv)_scale$")


class UnsupportedQuantizationError(ValueError):
    """A quantized checkpoint the plugin cannot honour; the message names the setting or tensor."""


def checkpoint_format(hf_config: dict) -> str | None:
    """The FP8 format of a checkpoint's config, None for an unquantized one (or one transformers dequantizes)."""
    config = hf_config.get("quantization_config") or {}
    method = config.get("quant_method")
    if method not in FORMATS:
        return None
    if method == "fp8" and config.get("fmt", "e4m3") != "e4m3":
        raise UnsupportedQuantizationError(f"quantization_config.fmt={config['fmt']!r}: only e4m3 FP8 is supported")
    if method == "modelopt":
        algo = config.get("quant_algo")
        if algo not in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN"):
            raise UnsupportedQuantizationError(
                f"quantization_config.quant_algo={algo!r}: only ModelOpt FP8 is supported"
            )
    if method == "compressed-tensors":
        _check_compressed_tensors(config)
    return method


def _check_compressed_tensors(config: dict) -> None:
    for name, group in (config.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        if weights.get("type") != "float" or weights.get("num_bits") != 8:
            raise UnsupportedQuantizationError(
                f"quantization_config.config_groups.{name}.weights: {weights.get('type')} {weights.get('num_bits')} "
                "bits; only FP8 (type float, 8 bits) compressed-tensors checkpoints are supported"
            )
        if weights.get("strategy") not in ("tensor", "channel", "block"):
            raise UnsupportedQuantizationError(
                f"quantization_config.config_groups.{name}.weights.strategy={weights.get('strategy')!r}: supported are "
                "tensor, channel and block"
            )


def fp8_state(raw: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under the decoder's names: each FP8 weight with `<name>_scale` in the artifact's layout
    (per channel [out] or per row block [out, in / 128], fp32), K/V cache scales as `<layer>.self_attn.k_scale` /
    `v_scale`, activation scales dropped. Refuses a layout it cannot honour, naming the tensor."""
    if args.num_experts:
        raise UnsupportedQuantizationError(
            "FP8 checkpoints of mixture-of-experts models are not supported: export the unquantized checkpoint "
            "with --quantize fp8"
        )
    out: dict[str, torch.Tensor] = {}
    for name, tensor in raw.items():
        if name.endswith(("weight_scale", "weight_scale_inv", "input_scale")):
            continue
        kv = _KV_SCALE.match(name)
        if kv:
            layer, which = kv.groups()
            for part in ("k", "v") if which == "kv" else (which,):
                out[f"{layer}.{part}_scale"] = tensor.float().reshape(())
            continue
        if tensor.dtype == fp8.FP8_DTYPE:
            out[name], out[name + fp8.SCALE_SUFFIX] = _weight_and_scale(name, tensor, raw)
        elif tensor.dtype.is_floating_point and tensor.element_size() == 1:
            raise UnsupportedQuantizationError(f"tensor {name}: dtype {tensor.dtype} is not supported (only e4m3fn)")
        else:
            out[name] = tensor
    return out


def _weight_and_scale(name: str, weight: torch.Tensor, raw: dict) -> tuple[torch.Tensor, torch.Tensor]:
    prefix = name.removesuffix("weight")
    scale = raw.get(prefix + "weight_scale_inv", raw.get(prefix + "weight_scale"))
    if scale is None or weight.dim() != 2:
        why = "has no weight_scale / weight_scale_inv" if scale is None else f"has shape {list(weight.shape)}"
        raise UnsupportedQuantizationError(f"FP8 tensor {name} {why}; only 2-D FP8 weights with a scale are supported")
    rows, columns = weight.shape
    scale = scale.float()
    if scale.numel() == 1:
        return weight, scale.reshape(1).expand(rows).contiguous()
    if scale.numel() == rows and (scale.dim() == 1 or scale.shape[1] == 1):
        return weight, scale.reshape(rows).contiguous()
    if scale.dim() == 2 and scale.shape[1] == -(-columns // fp8.BLOCK) and columns % fp8.BLOCK == 0:
        block_rows = -(-rows // scale.shape[0])
        if -(-rows // block_rows) == scale.shape[0]:
            expanded = scale.repeat_interleave(block_rows, dim=0)[:rows].contiguous()
            return weight, expanded[:, 0].contiguous() if expanded.shape[1] == 1 else expanded  # one block: per row
    raise UnsupportedQuantizationError(
        f"tensor {prefix}weight_scale{'_inv' if prefix + 'weight_scale_inv' in raw else ''} of shape "
        f"{list(scale.shape)} for weight {name} {list(weight.shape)}: supported are per-tensor, per-output-channel "
        f"and [rows, {fp8.BLOCK}]-block scales over input columns that are a multiple of {fp8.BLOCK}"
    )


def quantized_weight(name: str) -> bool:
    """Whether the artifact keeps weight `name` in FP8 (QUANTIZED_PROJECTIONS, dense layers only)."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in QUANTIZED_PROJECTIONS and ".experts." not in name


def kv_scale_names(args: ModelArgs) -> list[str]:
    names = []
    for i in range(args.num_hidden_layers):
        names += [f"model.layers.{i}.self_attn.k_scale", f"model.layers.{i}.self_attn.v_scale"]
    return names
