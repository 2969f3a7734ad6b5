"""Granite, Phi-3, SmolLM3, Qwen3-MoE, Mixtral and gpt-oss equal Hugging Face eager at every step of a teacher-forced
sequence: prefill calls that cross context bucket 16 (the light ladder: buckets 16 and 64), then decode steps. What each
family adds to the shared decoder: Granite's embedding, attention, residual and logits multipliers (all away from 1
in the tiny model), Phi-3's fused qkv_proj and gate_up_proj (split on load), SmolLM3's layers without rope, the MoE
block (its experts run densely in the chunks and gathered by the router's indices in the decode steps), gpt-oss's
attention sinks, YaRN rope, clamped SwiGLU and biases, with a sliding layer (window 6) next to a full one."""

from __future__ import annotations

import pytest
import torch
from support.references import hf_next_logits
from support.tiny_models import quick_first

from optimum_neuron_plugin.models.args import SUPPORTED_ARCHITECTURES, ModelArgs, UnsupportedModelError

from .helpers import HOST_SAMPLING, chunked_shape, prompt

ATOL = 1e-4
LENGTH = 45
PREFILL_CALLS = [5, 8, 3, 8, 7]  # to position 31, crossing bucket 16 mid-call


@pytest.mark.parametrize("name", quick_first(HOST_SAMPLING, quick=("granite",)))
def test_teacher_forced_chunks_then_decode_equal_hf(zoo, name):
    artifact = zoo.artifact(name, **chunked_shape(name))
    artifact.hf.set_attn_implementation("eager")
    model, tokens = artifact.model, prompt(LENGTH, seed=70)
    expected = hf_next_logits(artifact.hf, [tokens])[0]
    start = 0
    for size in PREFILL_CALLS:
        logits = model.prefill(0, tokens[start : start + size], start)
        start += size
        torch.testing.assert_close(logits, expected[start - 1], atol=ATOL, rtol=0, msg=f"prefill to {start}")
    for position in range(start, LENGTH):
        result = model.decode([0], [tokens[position]], [position])
        torch.testing.assert_close(result.logits[0], expected[position], atol=ATOL, rtol=0, msg=f"decode {position}")


def test_family_features_are_read(zoo):
    granite = ModelArgs.from_hf_config(zoo.tiny("granite").hf.config.to_dict())
    assert (granite.embed_scale, granite.attention_scale, granite.residual_multiplier, granite.logits_scaling) == (
        3.0, 0.3, 0.5, 2.0,
    )  # fmt: skip
    assert ModelArgs.from_hf_config(zoo.tiny("smollm3").hf.config.to_dict()).rope_layers == (True, False)
    assert "model.layers.0.self_attn.qkv_proj.weight" in zoo.tiny("phi3").hf.state_dict()


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(UnsupportedModelError) as refused:
        ModelArgs.from_hf_config({"architectures": ["DeepseekV3ForCausalLM"]})
    assert str(refused.value).startswith("architecture 'DeepseekV3ForCausalLM' is not supported; supported: ")
    assert all(name in str(refused.value) for name in SUPPORTED_ARCHITECTURES) and len(SUPPORTED_ARCHITECTURES) == 11


def test_phi3_long_rope_is_refused_with_the_supported_scalings(zoo):
    config = zoo.tiny("phi3").hf.config.to_dict()
    long_rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    with pytest.raises(UnsupportedModelError, match="rope scaling 'longrope' is not supported; supported: default"):
        ModelArgs.from_hf_config({**config, "rope_parameters": long_rope})
