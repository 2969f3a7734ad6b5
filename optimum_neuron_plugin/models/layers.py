"""RMSNorm, rotary embedding and the gated MLP, as plain functions of tensors.

RMSNorm, the MLP's gated activation and the rotation are also ops, `onp::rms_norm`, `onp::gated_activation` and
`onp::rope` (op=True), whose
definitions are the plain forms here: a backend may register a kernel computing the same function in one pass (the
CPU backend's, backends/cpu_pointwise.py), where the plain forms run one aten op, one pass over the tensor, per step."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import fp8
from .args import ModelArgs

Adapt = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0, op: bool = False) -> torch.Tensor:
    """Llama's RMSNorm (weight * normalised x, cast first); with an offset, Gemma's: (offset + weight) * x in fp32,
    then cast. op: as the op onp::rms_norm."""
    return rms_norm_op(x, weight, eps, offset) if op else plain_rms_norm(x, weight, eps, offset)


def plain_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    # Casts only where the dtype changes: an fp32 graph would otherwise hold two no-op casts per norm.
    x32 = x if x.dtype == torch.float32 else x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        scaled = x32 * (offset + (weight if weight.dtype == torch.float32 else weight.float()))
        return scaled if x.dtype == torch.float32 else scaled.to(x.dtype)
    return weight * (x32 if x.dtype == torch.float32 else x32.to(x.dtype))


@torch.library.custom_op("onp::rms_norm", mutates_args=())
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """plain_rms_norm as one op of the exported program: a backend's kernel replaces this form."""
    return plain_rms_norm(x, weight, eps, offset)


@rms_norm_op.register_fake
def _rms_norm_shape(x, weight, eps, offset) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ weight.T + bias; an FP8 weight comes with its scale (models/fp8.py)."""
    return F.linear(x, weight, bias) if scale is None else fp8.linear(x, weight, scale, bias)


def mlp(
    x: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    act: str = "silu",
    scales: tuple[torch.Tensor | None, ...] = (None, None, None),
    op: bool = False,
    adapt: Adapt | None = None,
    prefix: str = "",
) -> torch.Tensor:
    """down(act(gate(x)) * up(x)); op: the gated activation as the op onp::gated_activation. adapt(name, input,
    output): each projection's output adapted (LoRA, models/lora.py), name being prefix + "gate_proj" and so on."""
    gate_scale, up_scale, down_scale = scales
    adapt = adapt or (lambda name, inputs, outputs: outputs)
    gated = adapt(prefix + "gate_proj", x, linear(x, gate, scale=gate_scale))
    up_out = adapt(prefix + "up_proj", x, linear(x, up, scale=up_scale))
    hidden = gated_activation(gated, up_out, act) if op else plain_gated_activation(gated, up_out, act)
    return adapt(prefix + "down_proj", hidden, linear(hidden, down, scale=down_scale))


def activation(x: torch.Tensor, act: str) -> torch.Tensor:
    return F.gelu(x, approximate="tanh") if act == "gelu_pytorch_tanh" else F.silu(x)


def plain_gated_activation(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    return activation(gate, act) * up


@torch.library.custom_op("onp::gated_activation", mutates_args=())
def gated_activation(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """plain_gated_activation as one op of the exported program: a backend's kernel replaces this form."""
    return plain_gated_activation(gate, up, act)


@gated_activation.register_fake
def _gated_activation_shape(gate, up, act) -> torch.Tensor:
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def rope_inv_freq(args: ModelArgs, sliding: bool = False) -> torch.Tensor:
    """The rotary frequencies of the full-attention layers, or of the sliding ones (their own base, unscaled)."""
    dim = args.head_dim
    theta = args.sliding_rope_theta if sliding and args.sliding_rope_theta else args.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if sliding and args.sliding_rope_theta:
        return inv_freq
    if args.rope_scaling and args.rope_scaling["rope_type"] == "linear":
        return inv_freq / args.rope_scaling["factor"]
    if args.rope_scaling and args.rope_scaling["rope_type"] == "yarn":
        return _yarn_scaled(inv_freq, args.rope_scaling, dim, theta)
    if args.rope_scaling:
        inv_freq = _llama3_scaled(inv_freq, args.rope_scaling)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_context = scaling.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_scaled(inv_freq: torch.Tensor, scaling: dict, dim: int, theta: float) -> torch.Tensor:
    """YaRN: frequencies interpolated by `factor` below the correction range, kept above it, ramped between."""
    factor, old_context = scaling["factor"], scaling["original_max_position_embeddings"]
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_context / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(fast), correction_dim(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)


def rope_attention_factor(args: ModelArgs) -> float:
    """YaRN's scale of cos/sin (1 for every other rope)."""
    scaling = args.rope_scaling
    if not scaling or scaling["rope_type"] != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    return get_mscale(factor)


def rope_cos_sin(
    position_ids: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, scale: float = 1.0
) -> tuple[torch.Tensor, ...]:
    """cos/sin of shape [n, T, 1, head_dim] (times `scale`: YaRN's attention factor), computed in the graph."""
    freqs = position_ids.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, op: bool = False) -> torch.Tensor:
    """x [n, T, H, D] rotated by cos/sin [n, T, 1, D]; op: as the op onp::rope."""
    return rope_op(x, cos, sin) if op else plain_rope(x, cos, sin)


@torch.library.custom_op("onp::rope", mutates_args=())
def rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """plain_rope as one op of the exported program: a backend's kernel replaces this form."""
    return plain_rope(x, cos, sin)


@rope_op.register_fake
def _rope_shape(x, cos, sin) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def plain_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
