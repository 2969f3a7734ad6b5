"""The norm, gated-activation and rotation ops' CPU kernels (backends/cpu_pointwise.py) compute their definitions
(models/layers.py, plain_rms_norm, plain_gated_activation, plain_rope): within fp32 rounding in fp32, the same bf16
values in bf16, for rows of any length (the vector width's tail), Gemma's weight offset, rows of a strided view (the
q/k of a stacked projection's slices) and both activations. The exported programs call the ops (every HF parity test
of the core suite runs through them)."""

from __future__ import annotations

import pytest
import torch

from optimum_neuron_plugin.backends.cpu_pointwise import gated_activation_cpu, rms_norm_cpu, rope_cpu
from optimum_neuron_plugin.models.layers import (
    plain_gated_activation,
    plain_rms_norm,
    plain_rope,
    rope_cos_sin,
)


def _rand(*shape, dtype=torch.float32, seed=0, scale=3.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


@pytest.mark.parametrize("dim", [576, 64, 44, 7])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_is_its_definition_within_fp32_rounding(dim, offset):
    x, weight = _rand(3, 5, dim), _rand(dim, seed=1, scale=1.0)
    torch.testing.assert_close(rms_norm_cpu(x, weight, 1e-6, offset), plain_rms_norm(x, weight, 1e-6, offset))


def test_rms_norm_of_a_strided_view_normalises_each_row():
    stacked = _rand(1, 10, 960)  # [q | k | v] of one projection: q's heads are 64-wide rows, 960 apart
    q, weight = stacked[..., :576].view(1, 10, 9, 64), _rand(64, seed=1)
    out = rms_norm_cpu(q, weight, 1e-5, 0.0)
    assert out.is_contiguous()
    torch.testing.assert_close(out, plain_rms_norm(q, weight, 1e-5))


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_in_bf16_rounds_like_its_definition(offset):
    x, weight = _rand(4, 576, dtype=torch.bfloat16), _rand(576, seed=1, dtype=torch.bfloat16)
    out = rms_norm_cpu(x, weight, 1e-6, offset)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, plain_rms_norm(x, weight, 1e-6, offset), atol=0, rtol=0)


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_activation_is_its_definition(act, dtype):
    both = _rand(2, 7, 2 * 1537, dtype=dtype)  # gate and up: slices of one stacked product, 1537 = 8 * 192 + 1
    gate, up = both[..., :1537], both[..., 1537:]
    out = gated_activation_cpu(gate, up, act)
    assert out.dtype == dtype and out.shape == gate.shape
    expected = plain_gated_activation(gate, up, act)
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-6)
    else:  # one bf16 step at most where the fp32 activations round differently
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=8e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_is_its_definition(dtype):
    stacked = _rand(2, 10, 960, dtype=dtype)  # q's 9 heads of 64, then k and v
    q = stacked[..., :576].view(2, 10, 9, 64)
    positions = torch.arange(100, 120).view(2, 10)
    cos, sin = rope_cos_sin(positions, 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64)), dtype)
    out = rope_cpu(q, cos, sin)
    assert out.is_contiguous() and out.dtype == dtype
    exact = dict(atol=0, rtol=0) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(out, plain_rope(q, cos, sin), **exact)


def test_an_unknown_activation_is_refused():
    with pytest.raises(RuntimeError, match="act is silu or gelu_pytorch_tanh"):
        gated_activation_cpu(_rand(2, 8), _rand(2, 8), "relu")


def test_the_graphs_call_the_ops(llama_logits):
    """Every graph of the tiny 2-layer Llama runs its norms (2 per layer and the final one), each layer's gated
    activation and its q and k rotations through the ops, in the program rebuilt from its record."""
    programs = llama_logits.model.graphs.programs
    norms, gated, rope = (torch.ops.onp.rms_norm.default, torch.ops.onp.gated_activation.default,
                          torch.ops.onp.rope.default)  # fmt: skip
    decoder_graphs = [p for spec, p in programs.items() if spec.name != "copy_prefix"]
    assert decoder_graphs
    for program in decoder_graphs:
        assert len(program.graph.find_nodes(op="call_function", target=norms)) == 5
        assert len(program.graph.find_nodes(op="call_function", target=gated)) == 2
        assert len(program.graph.find_nodes(op="call_function", target=rope)) == 4
