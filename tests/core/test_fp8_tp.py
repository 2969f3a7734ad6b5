"""FP8 weights and FP8 KV cache under tensor parallelism (CPU backend, 2 gloo ranks): the tp 2 export's logits and
greedy tokens are the tp 1 export's, and the ranks' FP8 cache shards concatenate to the tp 1 cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.tensor_parallel import merge_kv_shards, run_ranks
from support.tiny_models import export

from optimum_neuron_plugin import NeuronModelForCausalLM
from optimum_neuron_plugin.models.sharding import layout_for

from .helpers import prompt

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]  # two exports and two spawned ranks

SHAPE = dict(
    batch_size=2, sequence_length=64, prefill_chunk_size=8, on_device_sampling=False, context_buckets=(64,),
    prefill_buckets=(0, 16, 64), decode_batch_sizes=(2,), quantization="fp8", kv_cache_dtype="fp8",
)  # fmt: skip
PROMPTS = [prompt(13, seed=21), prompt(21, seed=22)]
STEPS = 6


def scenario(model: NeuronModelForCausalLM) -> dict:
    logits = [model.prefill(slot, tokens) for slot, tokens in enumerate(PROMPTS)]
    tokens = [[int(x.argmax())] for x in logits]
    decoded = []
    for step in range(STEPS):
        out = model.decode([0, 1], [t[-1] for t in tokens], [len(p) + step for p in PROMPTS])
        decoded.append(out.logits)
        for row, token in zip(tokens, out.tokens, strict=True):
            row.append(token)
    return {"prefill": logits, "decode": decoded, "tokens": tokens, "caches": [c.clone() for c in model.caches]}


def rank_worker(rank: int, artifact: Path, out: Path) -> None:
    torch.save(scenario(NeuronModelForCausalLM.from_pretrained(artifact)), out / f"rank{rank}.pt")


def test_fp8_tp2_computes_what_tp1_computes(zoo, tmp_path):
    source = zoo.tiny("llama").path
    tp1 = NeuronModelForCausalLM.from_pretrained(export(source, tmp_path / "tp1", **SHAPE))
    expected = scenario(tp1)
    tp2 = export(source, tmp_path / "tp2", tp_degree=2, **SHAPE)
    run_ranks(rank_worker, 2, tp2, tmp_path, start_method="fork")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    got = ranks[0]
    for a, b in zip(got["prefill"] + got["decode"], expected["prefill"] + expected["decode"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    assert got["tokens"] == expected["tokens"] == ranks[1]["tokens"]
    replicas = layout_for(tp1.args, 2).kv_replicas
    for layer, cache in enumerate(expected["caches"]):
        merged = merge_kv_shards([r["caches"][layer] for r in ranks], replicas)
        assert merged.dtype == cache.dtype == torch.float8_e4m3fn
        # the same K/V rounded to E4M3: equal but where the two exports' fp32 sums land on either side of a rounding
        same = (merged.view(torch.uint8) == cache.view(torch.uint8)).float().mean()
        assert same > 0.999, (layer, float(same))
