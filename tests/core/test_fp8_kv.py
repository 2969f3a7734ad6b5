"""FP8 KV cache (kv_cache_dtype "fp8"): the cache holds E4M3 bytes, attention stays within a stated bound of the fp32
cache's, prefix copies and continued prefills are exact, verify runs on it, and a checkpoint's K/V scales are used."""

from __future__ import annotations

import pytest
import torch
from support.fp8_checkpoints import save_fp8
from support.tiny_models import tiny_model

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.models import fp8
from optimum_neuron_plugin.runtime import fp8_params

from .helpers import CHUNKED_LOGITS_LIGHT, SEEDS, VOCAB, prompt, slot_positions

SHAPE = dict(CHUNKED_LOGITS_LIGHT, speculative_tokens=2)
# Largest logit error of the FP8 cache against the fp32 cache, tiny Llama (logits of magnitude ~2; measured 0.08 after
# a prefill, 0.10 after a decode step): E4M3 rounds each K/V value to 3 mantissa bits (within 1/16 of itself).
BOUND = 0.2


@pytest.fixture(scope="module")
def pair(zoo):
    """The tiny Llama exported twice, fp32 cache and FP8 cache (calibrated scales), loaded back."""
    return zoo.artifact("llama", **SHAPE).model, zoo.artifact("llama", kv_cache_dtype="fp8", **SHAPE).model


def test_the_cache_holds_fp8_and_attention_stays_within_the_bound(pair):
    exact, quantized = pair
    assert all(cache.dtype == torch.float8_e4m3fn for cache in quantized.caches)
    assert all(cache.dtype == torch.float32 for cache in exact.caches)
    tokens = prompt(30, seed=11)
    logits = [model.prefill(0, tokens) for model in pair]
    assert 0 < (logits[0] - logits[1]).abs().max() < BOUND
    # Layer 0's K: the same input in both exports. Stored: the fp32 cache's K divided by the layer's scale, in E4M3.
    written = slot_positions(quantized, quantized.caches[0], 0)[:30]
    scale = quantized.params["model.layers.0.self_attn.k_scale"]
    expected = fp8.quantize_kv(slot_positions(exact, exact.caches[0], 0)[:30], scale)
    assert torch.equal(written.view(torch.uint8), expected.view(torch.uint8))
    assert fp8.KV_MAX / 4 < written.float().abs().max() <= fp8.KV_MAX  # calibrated: the range is used
    token = int(logits[0].argmax())
    steps = [model.decode([0], [token], [30]).logits[0] for model in pair]
    assert (steps[0] - steps[1]).abs().max() < BOUND


def test_a_prefix_copy_and_its_continuation_are_exact_on_the_fp8_cache(pair):
    model = pair[1]
    shared = prompt(20, seed=12)
    model.prefill(0, shared)
    model.copy_prefix(0, 1, 13)
    source, copied = (slot_positions(model, model.caches[3], s)[:13] for s in (0, 1))
    assert torch.equal(copied.view(torch.uint8), source.view(torch.uint8))
    tokens = shared[:13] + prompt(7, seed=13)
    continued = model.prefill(1, tokens[13:], start=13)
    full = model.prefill(2, tokens)  # chunks attend their own K/V as stored: the same values either way
    torch.testing.assert_close(continued, full, atol=1e-5, rtol=1e-5)


def test_verify_on_the_fp8_cache_gives_the_decode_steps_logits(pair):
    model = pair[1]
    tokens = prompt(17, seed=14)
    first = int(model.prefill(0, tokens).argmax())
    second = model.decode([0], [first], [17]).logits[0]
    model.prefill(1, tokens)
    verified = model.verify([1], [[first, int(second.argmax()), 5]], [17])
    torch.testing.assert_close(verified[0, 0], second, atol=1e-4, rtol=1e-4)


def test_a_checkpoints_kv_scales_are_used(tmp_path):
    hf = tiny_model("llama", seed=SEEDS["llama"], vocab_size=VOCAB)
    directory = save_fp8(tmp_path / "modelopt", hf, "modelopt")
    config = NeuronConfig(kv_cache_dtype="fp8", **dict(CHUNKED_LOGITS_LIGHT, batch_size=1, decode_batch_sizes=None))
    model = NeuronModelForCausalLM.export(directory, config)
    # ModelOpt's scales map K/V to +-448; the cache holds +-240: the scales grow by 448 / 240
    assert float(model.params["model.layers.1.self_attn.k_scale"]) == pytest.approx(0.012 * 448 / 240)
    assert float(model.params["model.layers.0.self_attn.v_scale"]) == pytest.approx(0.008 * 448 / 240)


def test_calibration_maps_the_samples_largest_value_below_the_range(pair):
    model = pair[0]
    scales = fp8_params.calibrated_kv_scales(model.args, model.params, None)
    assert list(scales) == [f"model.layers.{i}.self_attn.{x}_scale" for i in range(2) for x in "kv"]
    assert scales == {name: model_scale for name, model_scale in pair[1].params.items() if name in scales}
