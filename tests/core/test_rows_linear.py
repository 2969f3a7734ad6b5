"""The few-row linear kernel (backends/csrc/rows_linear.cpp, chosen by backends/cpu_linear.py for programs of at most
4 tokens) computes the linear within fp32 rounding: 1 to 4 rows, input and output widths off its vector and block
widths, with and without a bias, leading dimensions kept; it refuses more rows than it takes and a weight it did not
pack. The decode graphs run it (every decode test against HF runs through it)."""

from __future__ import annotations

import pytest
import torch

from optimum_neuron_plugin.backends import cpu_kernels, cpu_linear

cpu_kernels.load()
pack, rows_linear = torch.ops.onp_cpu.pack_rows_weight, torch.ops.onp_cpu.rows_linear


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _within_fp32_rounding(got: torch.Tensor, x, weight, bias) -> None:
    """No further from the product in fp64 than torch's fp32 linear is, or 8 ulps of the output's magnitude."""
    exact = torch.nn.functional.linear(x.double(), weight.double(), None if bias is None else bias.double())
    rounding = (torch.nn.functional.linear(x, weight, bias).double() - exact).abs().max().item()
    ulps = 8 * torch.finfo(torch.float32).eps * exact.abs().max().item()
    assert got.shape == exact.shape and got.dtype == torch.float32
    assert (got.double() - exact).abs().max().item() <= max(2 * rounding, ulps)


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize(("inputs", "outputs"), [(576, 960), (20, 33), (1536, 576), (7, 1)])
@pytest.mark.parametrize("biased", [False, True])
def test_the_kernel_is_the_linear_within_fp32_rounding(rows, inputs, outputs, biased):
    x, weight = _rand(rows, inputs), _rand(outputs, inputs, seed=1)
    bias = _rand(outputs, seed=2) if biased else None
    _within_fp32_rounding(rows_linear(x, pack(weight), bias, outputs), x, weight, bias)


def test_leading_dimensions_are_kept():
    x, weight = _rand(2, 1, 64), _rand(40, 64, seed=1)
    got = rows_linear(x, pack(weight), None, 40)
    assert got.shape == (2, 1, 40)
    _within_fp32_rounding(got, x, weight, None)


def test_more_rows_than_the_kernel_takes_are_refused():
    x, weight = _rand(cpu_linear.ROWS_KERNEL_MAX + 1, 64), _rand(40, 64, seed=1)
    with pytest.raises(RuntimeError, match="at most 4 rows, got 5"):
        rows_linear(x, pack(weight), None, 40)


def test_a_weight_the_kernel_did_not_pack_is_refused():
    x, weight = _rand(2, 64), _rand(40, 64, seed=1)
    with pytest.raises(RuntimeError, match=r"not pack_rows_weight's of a \[40, 64\] weight"):
        rows_linear(x, weight.view(40, 64, 1), None, 40)
