"""The sizing check: one rank's weights, KV pool and activations against one logical NeuronCore's HBM, and the pool
the core holds after the weights in blocks, tokens and requests."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from optimum_neuron_plugin.config import NeuronConfig
from optimum_neuron_plugin.models.args import ModelArgs
from optimum_neuron_plugin.models.sharding import ShardingError
from optimum_neuron_plugin.sizing import (
    CHIPS,
    GIB,
    RUNTIME_RESERVE,
    SizingError,
    check_fits,
    plan_memory,
    weight_count,
)

LLAMA_8B = json.loads((Path(__file__).parents[1] / "fixtures" / "llama-3.1-8b" / "config.json").read_text())
LLAMA_70B = {**LLAMA_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
             "num_attention_heads": 64}  # fmt: skip
TINY = {**LLAMA_8B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256}  # fmt: skip


def _config(**options) -> NeuronConfig:
    shape = dict(
        batch_size=8, sequence_length=8192, prefill_chunk_size=1024, block_size=256, backend="neuron", target="trn2"
    )
    return NeuronConfig(torch_dtype="bfloat16", **{**shape, **options})


# Llama-3.1-8B: one token's K and V over its 32 layers (8 KV heads of 128, bf16); a 256-token block.
TOKEN_BYTES = 32 * 2 * 8 * 128 * 2
BLOCK_BYTES = 256 * TOKEN_BYTES


def test_chip_table_matches_the_neuron_docs():
    """Trainium2: 96 GiB of HBM per chip, eight physical NeuronCore-v3; Trainium3: 144 GiB, eight NeuronCore-v4; LNC=2
    by default (awsdocs-neuron: about-neuron/arch/neuron-hardware/trainium2, trainium3, logical-neuroncore-config)."""
    trn2, trn3 = CHIPS["trn2"], CHIPS["trn3"]
    assert (trn2.hbm_gib, trn2.physical_cores, trn2.default_lnc) == (96, 8, 2)
    assert (trn3.hbm_gib, trn3.physical_cores, trn3.default_lnc) == (144, 8, 2)
    assert trn2.core_bytes(2) == 24 * GIB and trn2.core_bytes(1) == 12 * GIB
    assert trn3.core_bytes(2) == 36 * GIB and trn3.core_bytes(1) == 18 * GIB


def test_llama_8b_weights_and_kv_pool_per_rank():
    """The default pool is today's memory (8 rows of 8,192 tokens) plus the null block."""
    args = ModelArgs.from_hf_config(LLAMA_8B)
    assert weight_count(args, 1) == 8_030_261_248  # Llama-3.1-8B's parameter count
    plan = plan_memory(args, _config(), CHIPS["trn2"], 2)
    assert BLOCK_BYTES == 32 * 1024**2 and plan.pool.num_blocks == 8 * 8192 // 256 + 1
    assert plan.kv_cache == 257 * BLOCK_BYTES == 8 * GIB + BLOCK_BYTES
    half = plan_memory(args, _config(tp_degree=2), CHIPS["trn2"], 2)
    assert half.kv_cache == plan.kv_cache // 2 and half.weights < plan.weights // 2 + 300 * 1024**2
    assert plan_memory(args, _config(num_blocks=1025), CHIPS["trn2"], 2).kv_cache == 1025 * BLOCK_BYTES


def test_the_pool_a_core_holds_after_the_weights_in_blocks_tokens_and_requests():
    args = ModelArgs.from_hf_config(LLAMA_8B)
    plan = plan_memory(args, _config(), CHIPS["trn2"], 2, average_length=1000)
    free = 24 * GIB - plan.weights - plan.activations - RUNTIME_RESERVE
    held = free // BLOCK_BYTES
    assert plan.blocks_that_fit == held and 0 < held < 257
    lines = plan.lines()
    assert lines[-3].startswith("KV pool: blocks of 256 tokens (32.00 MiB per rank), block 0 the null block;")
    assert lines[-3].endswith("a request of 1,000 tokens (--average-length) takes 4")
    assert lines[-2] == (
        "  compiled     257 blocks = 65,536 tokens = 64 requests of 1,000 tokens (--num-blocks 257; 8 rows per graph "
        "call)"
    )
    assert lines[-1] == (
        f"  core holds   {held:,} blocks = {(held - 1) * 256:,} tokens = {(held - 1) // 4:,} requests of 1,000 tokens "
        f"after the weights (--num-blocks {held})"
    )
    fitted = plan_memory(args, _config(num_blocks=held), CHIPS["trn2"], 2)
    assert fitted.fits and not plan_memory(args, _config(num_blocks=held + 1), CHIPS["trn2"], 2).fits
    default = plan_memory(args, _config(), CHIPS["trn2"], 2)  # requests of half the sequence length: 16 blocks
    assert "= 16 requests of 4,096 tokens (--num-blocks 257;" in default.lines()[-2]


def test_block_size_sequence_length_is_one_request_per_block():
    """One block per row (today's contiguous rows): a request takes a whole block whatever its length."""
    args = ModelArgs.from_hf_config(LLAMA_8B)
    plan = plan_memory(args, _config(block_size=8192), CHIPS["trn3"], 2, average_length=100)
    assert plan.pool.num_blocks == 9 and plan.kv_cache == 9 * GIB
    assert plan.lines()[-2].startswith("  compiled     9 blocks = 65,536 tokens = 8 requests of 100 tokens")


def test_average_length_outside_the_sequence_is_refused():
    args = ModelArgs.from_hf_config(LLAMA_8B)
    for length in (0, 8193):
        with pytest.raises(ValueError, match=rf"--average-length {length} is not allowed: must be in \[1, "):
            plan_memory(args, _config(), CHIPS["trn2"], 2, average_length=length)


def test_tiny_config_fits_and_cpu_is_information_only():
    args = ModelArgs.from_hf_config(TINY)
    plan = plan_memory(args, _config(batch_size=2, sequence_length=256, prefill_chunk_size=64), CHIPS["trn2"], 2)
    assert plan.fits and plan.total < GIB + 10 * 1024**2
    check_fits(plan, args, _config())  # no error
    cpu = plan_memory(args, _config(backend="cpu", target=None), None)
    assert cpu.fits and cpu.capacity is None and cpu.blocks_that_fit is None
    assert "information only" in cpu.lines()[-3] and cpu.lines()[-1].startswith("  compiled ")


def test_llama_8b_b8_s8192_does_not_fit_one_trn2_core_and_names_the_pool_and_tp_2():
    args = ModelArgs.from_hf_config(LLAMA_8B)
    config = _config()
    plan = plan_memory(args, config, CHIPS["trn2"], 2)
    assert not plan.fits and plan.weights + plan.kv_cache > 22 * GIB
    held = plan.blocks_that_fit
    with pytest.raises(SizingError) as refused:
        check_fits(plan, args, config)
    message = refused.value.args[0]
    assert "KV cache 8.03 GiB = 257 blocks of 256 tokens" in message
    assert f"after the weights the core holds {held:,} blocks = {(held - 1) * 256:,} tokens = " in message
    assert message.endswith(f"use --num-blocks {held}, or --tensor-parallel-size 2 (the smallest that fits)")
    assert plan_memory(args, _config(target="trn3"), CHIPS["trn3"], 2).fits  # 36 GiB per trn3 logical core


def test_a_core_that_holds_no_full_length_request_names_no_pool():
    """Llama-3.1-8B's weights alone exceed a trn2 core at LNC=1 (12 GiB): no pool is offered, only the degree at which
    this pool fits; with a pool no degree holds, the refusal says what to lower."""
    args = ModelArgs.from_hf_config(LLAMA_8B)
    plan = plan_memory(args, _config(), CHIPS["trn2"], 1)
    assert plan.blocks_that_fit == 0
    with pytest.raises(SizingError) as refused:
        check_fits(plan, args, _config())
    message = refused.value.args[0]
    assert "the core holds 0 blocks = 0 tokens = 0 requests" in message and "--num-blocks" not in message
    assert message.endswith("use --tensor-parallel-size 4 (the smallest that fits)")
    huge = _config(num_blocks=1_000_000)
    with pytest.raises(SizingError, match="lower --num-blocks or --sequence-length$"):
        check_fits(plan_memory(args, huge, CHIPS["trn2"], 1), args, huge)


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
    assert fp8.kv_cache == bf16.kv_cache // 2 == 257 * BLOCK_BYTES // 2
    assert not bf16.fits and fp8.fits
