"""FP8 (E4M3) weights and KV cache: the numbers, the graph ops and the quantizers.

Weights. A quantized linear stores its weight as float8_e4m3fn [out, in] and `<name>.weight_scale`, fp32:
- [out]: one scale per output channel (a per-tensor scale is stored expanded to every channel);
- [out, in / 128]: one scale per 128 input columns of each row (a checkpoint's 128x128 blocks, expanded over rows).
The graph upcasts the weight to the compute dtype; a per-channel scale multiplies the matmul's output (NxD
Inference's weight-only FP8 form), a block scale multiplies the upcast weight before the matmul (docs/fp8.md).

Range. trn2's FP8 is E4M3 with a largest value of 240 (OCP E4M3FN, trn3's, reaches 448): weights are fitted to the
target's range at export (fit_range). The KV cache always holds values within +-240, the range both encodings
share, so its bytes mean the same on every target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
OCP_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max: trn3, and the checkpoints' range
TRN2_MAX = 240.0  # trn2's E4M3 (neuronx-cc casts e4m3fn to it: --experimental-unsafe-fp8e4m3fn-as-fp8e4m3)
KV_MAX = TRN2_MAX
BLOCK = 128  # input columns per block scale
SCALE_SUFFIX = "_scale"  # q_proj.weight -> q_proj.weight_scale


def weight_max(target: str | None) -> float:
    """The largest FP8 weight value the export's target holds: 240 on trn2, 448 on trn3 and on the CPU backend
    without a target. A neuron export's target is never None here: it is the host's when --instance-type is not
    given, and FP8 graphs are refused when neither says (optimum_neuron_plugin/devices.py)."""
    return TRN2_MAX if target == "trn2" else OCP_MAX


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ dequantize(weight, scale).T + bias, in x's dtype."""
    if scale.dim() == 1:  # per output channel: upcast, matmul, scale the output
        out = F.linear(x, weight.to(x.dtype)) * scale.to(x.dtype)
        return out if bias is None else out + bias
    return F.linear(x, dequantize(weight, scale, x.dtype), bias)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight the linear computes with: fp8 values times their scale, in `dtype`."""
    if scale.dim() == 1:
        return weight.to(dtype) * scale.to(dtype)[:, None]
    rows, columns = weight.shape
    blocks = weight.to(dtype).view(rows, columns // BLOCK, BLOCK) * scale.to(dtype)[:, :, None]
    return blocks.view(rows, columns)


def quantize_per_channel(weight: torch.Tensor, largest: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel quantization of a [out, in] weight: (fp8 weight, fp32 scale [out])."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / largest
    return (w / scale[:, None]).clamp(-largest, largest).to(FP8_DTYPE), scale


def fit_range(weight: torch.Tensor, scale: torch.Tensor, largest: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight rescaled into +-largest where it exceeds it, as NxD Inference does for trn2: each scale group (a
    row, or a row's block) holding a value above `largest` is multiplied by largest / 448 and clamped, its scale
    divided by the same factor. Groups within range keep their bytes; nothing becomes NaN."""
    w = weight.float()
    grouped = w.view(w.shape[0], -1, BLOCK) if scale.dim() == 2 else w[:, None, :]
    over = grouped.abs().amax(dim=-1) > largest  # [out, groups]
    if not bool(over.any()):
        return weight, scale
    factor = torch.where(over, largest / OCP_MAX, 1.0)
    fitted = (grouped * factor[..., None]).clamp(-largest, largest).reshape(w.shape).to(FP8_DTYPE)
    return fitted, scale / (factor if scale.dim() == 2 else factor[:, 0])


def quantize_kv(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """K or V as the cache stores them: values / scale within +-KV_MAX, in FP8."""
    return (values.float() / scale).clamp(-KV_MAX, KV_MAX).to(FP8_DTYPE)


def dequantize_kv(stored: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return stored.to(dtype) * scale.to(dtype)


def is_fp8(tensor: torch.Tensor) -> bool:
    return tensor.dtype == FP8_DTYPE
