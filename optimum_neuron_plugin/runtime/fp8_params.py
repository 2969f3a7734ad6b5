"""The artifact's FP8 tensors at export: projection weights in FP8 with their scales, and the KV cache's scales.

Weights (NeuronConfig.quantization "fp8"): every projection of models.fp8_checkpoint.QUANTIZED_PROJECTIONS is FP8,
the checkpoint's own FP8 weights kept with their scales, the others quantized per output channel; all of them fitted
to the target's range (models.fp8.fit_range). The other weights are in the model dtype.

KV cache (NeuronConfig.kv_cache_dtype "fp8"): one K and one V scale per layer, from the checkpoint when it has them
(computed for OCP's +-448, so multiplied by 448 / 240: the cache holds +-240), else calibrated here: the model
runs a fixed sample text and each scale is KV_HEADROOM x the largest |K| or |V| it wrote, divided by 240.
"""

from __future__ import annotations

import torch

from ..models import fp8
from ..models.args import ModelArgs
from ..models.fp8_checkpoint import kv_scale_names, quantized_weight

# Calibrated scales leave this factor of headroom above the sample's largest value: other texts may reach higher,
# and E4M3 keeps its relative precision down to 2^-6 of its range, so the headroom costs only the smallest values.
KV_HEADROOM = 2.0
CALIBRATION_TEXT = (
    "The history of science is the study of the development of science and scientific knowledge, including both "
    "the natural and social sciences. Question: what is 17 times 23? Answer: 391. def fibonacci(n):\n    return n "
    "if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n La ciudad de Madrid es la capital de España; 東京は日本の"
    "首都です. A list: apples, oranges, 42, 3.14159, [1, 2, 3], {'key': 'value'}."
)
CALIBRATION_TOKENS = 128


def param_names(names: list[str], args: ModelArgs, quantization: str | None, kv_cache_dtype: str | None) -> list[str]:
    """The artifact's tensor names in graph-input order: each FP8 weight followed by its scale, then the KV scales."""
    out = []
    for name in names:
        out.append(name)
        if quantization == "fp8" and quantized_weight(name):
            out.append(name + fp8.SCALE_SUFFIX)
    return out + (kv_scale_names(args) if kv_cache_dtype == "fp8" else [])


def fp8_weights(
    state: dict[str, torch.Tensor], names: list[str], dtype: torch.dtype, target: str | None
) -> dict[str, torch.Tensor]:
    """The weights `names` with every quantized projection in FP8 and its scale after it."""
    largest = fp8.weight_max(target)
    params: dict[str, torch.Tensor] = {}
    for name in names:
        tensor, scale = state[name], state.get(name + fp8.SCALE_SUFFIX)
        if not quantized_weight(name):
            params[name] = (fp8.dequantize(tensor, scale) if scale is not None else tensor).to(dtype).contiguous()
            continue
        weight, scale = (tensor, scale) if scale is not None else fp8.quantize_per_channel(tensor, largest)
        weight, scale = fp8.fit_range(weight, scale, largest)
        params[name], params[name + fp8.SCALE_SUFFIX] = weight.contiguous(), scale.float().contiguous()
    return params


def kv_scales(state: dict[str, torch.Tensor], args: ModelArgs, params: dict, tokenizer) -> dict[str, torch.Tensor]:
    """Each layer's K and V scale: the checkpoint's (all of them, or none), else calibrated on the sample text."""
    names = kv_scale_names(args)
    if all(name in state for name in names):
        return {name: (state[name].float() * (fp8.OCP_MAX / fp8.KV_MAX)).reshape(()) for name in names}
    return calibrated_kv_scales(args, params, tokenizer)


@torch.no_grad()
def calibrated_kv_scales(args: ModelArgs, params: dict, tokenizer) -> dict[str, torch.Tensor]:
    from ..models.decoder import decoder_logits
    from ..models.kv_cache import empty_cache
    from ..models.layers import rope_inv_freq

    length = min(CALIBRATION_TOKENS, args.max_position_embeddings)
    ids = tokenizer(CALIBRATION_TEXT)["input_ids"] if tokenizer is not None else []
    if len(ids) < length:  # no tokenizer, or a short tokenization: fixed pseudo-random ids fill the rest
        generator = torch.Generator().manual_seed(0)
        ids = ids + torch.randint(0, args.vocab_size, (length - len(ids),), generator=generator).tolist()
    dtype = params["model.embed_tokens.weight"].dtype
    # One block of `length` positions, the whole cache: block table [[0]].
    caches = empty_cache(args.num_hidden_layers, 1, length, args.num_key_value_heads, args.head_dim, dtype)
    input_ids = torch.tensor([ids[:length]], dtype=torch.int32)
    positions = torch.arange(length, dtype=torch.int32)[None]
    decoder_logits(
        args, params, caches, rope_inv_freq(args), input_ids, positions, torch.zeros(1, 1, dtype=torch.int32), length
    )
    scales = {}
    for name, cache in zip(kv_scale_names(args), caches, strict=True):
        largest = cache.float().abs().amax().clamp(min=1e-6)
        scales[name] = (largest * KV_HEADROOM / fp8.KV_MAX).reshape(())
    return scales
