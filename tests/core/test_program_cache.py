"""The CPU backend's compile cache (ONP_CPU_COMPILE_CACHE): an export whose graphs were compiled before copies
them, and the programs hold no weights, so a model of the same shape with other weights still equals HF."""

from __future__ import annotations

import pytest
import torch
from support.references import hf_last_logits
from support.tiny_models import save_tiny

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.backends.program_cache import CACHE_ENV

from .helpers import CHUNKED, CHUNKED_LOGITS_LIGHT, VOCAB, prompt


def test_a_second_model_of_the_same_shape_reuses_every_program(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    first, second = (save_tiny(tmp_path / f"hf-{seed}", "llama", seed=seed, vocab_size=VOCAB) for seed in (11, 12))
    config = NeuronConfig(**CHUNKED_LOGITS_LIGHT)
    NeuronModelForCausalLM.export(first, config)
    cached = sorted((tmp_path / "cache").iterdir())
    # two token_generation, chunk_and_decode and copy_prefix per context bucket, chunked_prefill per prefill bucket
    assert len(cached) == len(config.context_buckets) * 4 + len(config.prefill_buckets)

    def no_tracing(*args, **kwargs):
        raise AssertionError("a cached program was traced again")

    monkeypatch.setattr(torch.export, "export", no_tracing)
    model = NeuronModelForCausalLM.export(second, config)
    assert sorted((tmp_path / "cache").iterdir()) == cached
    tokens = prompt(2 * CHUNKED["prefill_chunk_size"] + 3, seed=5)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(second, dtype=torch.float32).eval()
    torch.testing.assert_close(model.prefill(0, tokens), hf_last_logits(hf, tokens), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("change", [dict(batch_size=2), dict(max_topk=8), dict(sequence_length=32)])
def test_another_shape_is_compiled(tmp_path, monkeypatch, change):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    source = save_tiny(tmp_path / "hf", "llama", seed=11, vocab_size=VOCAB)
    NeuronModelForCausalLM.export(source, NeuronConfig(**CHUNKED, context_buckets=(64,), prefill_buckets=(0, 64)))
    before = set((tmp_path / "cache").iterdir())
    length = change.get("sequence_length", 64)
    config = {**CHUNKED, "context_buckets": (length,), "prefill_buckets": (0, length), **change}
    NeuronModelForCausalLM.export(source, NeuronConfig(**config))
    assert set((tmp_path / "cache").iterdir()) > before
