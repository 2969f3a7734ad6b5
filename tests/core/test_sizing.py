"""The sizing check: one rank's weights, KV cache and activations against one logical NeuronCore's HBM."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from optimum_neuron_plugin.config import NeuronConfig
from optimum_neuron_plugin.models.args import ModelArgs
from optimum_neuron_plugin.models.sharding import ShardingError
from optimum_neuron_plugin.sizing import CHIPS, GIB, SizingError, check_fits, plan_memory, weight_count

LLAMA_8B = json.loads((Path(__file__).parents[1] / "fixtures" / "llama-3.1-8b" / "config.json").read_text())
LLAMA_70B = {**LLAMA_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
             "num_attention_heads": 64}  # fmt: skip
TINY = {**LLAMA_8B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256}  # fmt: skip


def _config(**options) -> NeuronConfig:
    shape = dict(batch_size=8, sequence_length=8192, prefill_chunk_size=1024, backend="neuron", target="trn2")
    return NeuronConfig(torch_dtype="bfloat16", **{**shape, **options})


def test_chip_table_matches_the_neuron_docs():
    """Trainium2: 96 GiB of HBM per chip, eight physical NeuronCore-v3; Trainium3: 144 GiB, eight NeuronCore-v4; LNC=2
    by default (awsdocs-neuron: about-neuron/arch/neuron-hardware/trainium2, trainium3, logical-neuroncore-config)."""
    trn2, trn3 = CHIPS["trn2"], CHIPS["trn3"]
    assert (trn2.hbm_gib, trn2.physical_cores, trn2.default_lnc) == (96, 8, 2)
    assert (trn3.hbm_gib, trn3.physical_cores, trn3.default_lnc) == (144, 8, 2)
    assert trn2.core_bytes(2) == 24 * GIB and trn2.core_bytes(1) == 12 * GIB
    assert trn3.core_bytes(2) == 36 * GIB and trn3.core_bytes(1) == 18 * GIB


def test_llama_8b_weights_and_kv_cache_per_rank():
    args = ModelArgs.from_hf_config(LLAMA_8B)
    assert weight_count(args, 1) == 8_030_261_248  # Llama-3.1-8B's parameter count
    plan = plan_memory(args, _config(), CHIPS["trn2"], 2)
    assert plan.kv_cache == 32 * 8 * 8192 * 2 * 8 * 128 * 2 == 8 * GIB
    half = plan_memory(args, _config(tp_degree=2), CHIPS["trn2"], 2)
    assert half.kv_cache == plan.kv_cache // 2 and half.weights < plan.weights // 2 + 300 * 1024**2


def test_tiny_config_fits_and_cpu_is_information_only():
    args = ModelArgs.from_hf_config(TINY)
    plan = plan_memory(args, _config(batch_size=2, sequence_length=256, prefill_chunk_size=64), CHIPS["trn2"], 2)
    assert plan.fits and plan.total < GIB + 10 * 1024**2
    check_fits(plan, args, _config())  # no error
    cpu = plan_memory(args, _config(backend="cpu", target=None), None)
    assert cpu.fits and cpu.capacity is None and "information only" in cpu.lines()[-1]


def test_llama_8b_b8_s8192_does_not_fit_one_trn2_core_and_names_tp_2():
    args = ModelArgs.from_hf_config(LLAMA_8B)
    config = _config()
    plan = plan_memory(args, config, CHIPS["trn2"], 2)
    assert not plan.fits and plan.weights + plan.kv_cache > 22 * GIB
    with pytest.raises(SizingError, match="use --tensor-parallel-size 2 "):
        check_fits(plan, args, config)
    assert plan_memory(args, _config(target="trn3"), CHIPS["trn3"], 2).fits  # 36 GiB per trn3 logical core


def test_refusal_names_the_smallest_allowed_degree_that_fits():
    args = ModelArgs.from_hf_config(LLAMA_70B)
    config = _config(batch_size=16)
    with pytest.raises(SizingError, match=r"--tensor-parallel-size (\d+) ") as refused:
        check_fits(plan_memory(args, config, CHIPS["trn2"], 2), args, config)
    degree = int(refused.value.args[0].split("--tensor-parallel-size ")[1].split()[0])
    assert plan_memory(args, replace(config, tp_degree=degree), CHIPS["trn2"], 2).fits
    for smaller in range(1, degree):
        with contextlib.suppress(ShardingError):  # a degree the model's heads do not allow
            assert not plan_memory(args, replace(config, tp_degree=smaller), CHIPS["trn2"], 2).fits


def test_fp8_weights_and_kv_cache_take_one_byte_and_fit_one_trn2_core():
    """Llama-3.1-8B b8 s8192: FP8 projections (6.98 B of its 8.03 B weights) and an FP8 KV cache halve what the
    bf16 export needs, which then fits one trn2 logical core at TP 1."""
    args = ModelArgs.from_hf_config(LLAMA_8B)
    bf16 = plan_memory(args, _config(), CHIPS["trn2"], 2)
    fp8 = plan_memory(args, _config(quantization="fp8", kv_cache_dtype="fp8"), CHIPS["trn2"], 2)
    projections = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 14336 * 4096)
    assert fp8.weights == bf16.weights - projections
    assert fp8.kv_cache == bf16.kv_cache // 2 == 4 * GIB
    assert not bf16.fits and fp8.fits
