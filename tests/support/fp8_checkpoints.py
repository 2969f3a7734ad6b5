"""Tiny FP8 checkpoints in the three formats the exporter reads, written the way their tools write them.

Each projection weight of a tiny random model is quantized with real scales (each group's largest value maps to
E4M3FN's 448, so every format holds values above trn2's 240), saved as float8_e4m3fn with its scale tensors under
the format's names, and config.json carries the format's quantization_config:
- "fp8": 128x128 block scales `weight_scale_inv` (transformers' FineGrainedFP8, the Qwen3 FP8 releases);
- "compressed-tensors": per-output-channel `weight_scale` [out, 1] (or per tensor [1] with strategy "tensor"), a
  dynamic per-token input scheme, and per-layer `self_attn.k_scale` / `v_scale` (kv_cache_scheme);
- "modelopt": per-tensor `weight_scale` and `input_scale` scalars, `k_proj.k_scale` / `v_proj.v_scale`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from .tiny_models import build_atomically

FP8 = torch.float8_e4m3fn
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj")
FORMATS = ("fp8", "compressed-tensors", "compressed-tensors-tensor", "modelopt")
# Block scales need input sizes that are multiples of 128: the tiny shape widened (head_dim 32, 64 K/V rows).
BLOCK_SHAPE = dict(hidden_size=128, intermediate_size=256)


def quantize(weight: torch.Tensor, kind: str) -> dict[str, torch.Tensor]:
    """A weight's FP8 tensors in format `kind`, by their suffix after `<linear>.`."""
    w = weight.float()
    if kind == "fp8":
        rows, columns = w.shape
        padded = torch.zeros(-(-rows // 128) * 128, columns)
        padded[:rows] = w
        blocks = padded.view(-1, 128, columns // 128, 128)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0  # [rows / 128, columns / 128]
        q = (blocks / scale[:, None, :, None]).view(-1, columns)[:rows]
        return {"weight": q.clamp(-448, 448).to(FP8), "weight_scale_inv": scale}
    if kind == "compressed-tensors":
        scale = w.abs().amax(dim=1, keepdim=True) / 448.0  # [out, 1]
        return {"weight": (w / scale).clamp(-448, 448).to(FP8), "weight_scale": scale}
    scale = w.abs().amax() / 448.0
    tensors = {"weight": (w / scale).clamp(-448, 448).to(FP8)}
    if kind == "compressed-tensors-tensor":
        return tensors | {"weight_scale": scale.reshape(1)}
    return tensors | {"weight_scale": scale.reshape(()), "input_scale": torch.tensor(0.02)}


def quantization_config(kind: str) -> dict:
    if kind == "fp8":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
    if kind == "modelopt":
        return {
            "quant_method": "modelopt",
            "quant_algo": "FP8",
            "kv_cache_quant_algo": "FP8",
            "exclude_modules": ["lm_head"],
        }
    strategy = "tensor" if kind == "compressed-tensors-tensor" else "channel"
    weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False},
    }


def fp8_tensors(model: torch.nn.Module, kind: str) -> dict[str, torch.Tensor]:
    """The model's state dict with every projection quantized in format `kind` (and K/V scales)."""
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for name in [n for n in state if n.endswith(".weight") and n.rsplit(".", 2)[-2] in PROJECTIONS]:
        prefix = name.removesuffix("weight")
        state.pop(name)
        state |= {prefix + suffix: tensor for suffix, tensor in quantize(model.state_dict()[name], kind).items()}
    for i in range(model.config.num_hidden_layers):
        k_scale, v_scale = torch.tensor(0.01 + 0.002 * i), torch.tensor(0.008 + 0.001 * i)
        if kind == "modelopt":
            state[f"model.layers.{i}.self_attn.k_proj.k_scale"] = k_scale
            state[f"model.layers.{i}.self_attn.v_proj.v_scale"] = v_scale
        elif kind.startswith("compressed-tensors"):
            state[f"model.layers.{i}.self_attn.k_scale"] = k_scale.reshape(1)
            state[f"model.layers.{i}.self_attn.v_scale"] = v_scale.reshape(1)
    return state


def save_fp8(directory: Path, model: torch.nn.Module, kind: str) -> Path:
    """`model` written as an FP8 checkpoint of format `kind` (config.json, model.safetensors), once."""

    def build(staging: Path) -> None:
        config = model.config.to_dict() | {"quantization_config": quantization_config(kind)}
        (staging / "config.json").write_text(json.dumps(config, indent=2, default=str))
        save_file(fp8_tensors(model, kind), str(staging / "model.safetensors"))

    return build_atomically(Path(directory), build)


def dequantized_model(model: torch.nn.Module, directory: Path, dequantize) -> torch.nn.Module:
    """A copy of `model` whose projection weights are the checkpoint's, dequantized by `dequantize(tensors)`
    (tensors: the linear's stored tensors by suffix): the reference that computes what the FP8 graphs compute."""
    from safetensors.torch import load_file

    stored = load_file(str(Path(directory) / "model.safetensors"))
    reference = type(model)(model.config).eval()
    state = model.state_dict()
    for name in [n for n in state if n.endswith(".weight") and n.rsplit(".", 2)[-2] in PROJECTIONS]:
        prefix = name.removesuffix("weight")
        state[name] = dequantize({k.removeprefix(prefix): v for k, v in stored.items() if k.startswith(prefix)})
    reference.load_state_dict(state)
    return reference
