"""The CPU backend's compile cache (ONP_CPU_COMPILE_CACHE): an export whose graphs were compiled before copies
them, and the programs hold no weights, so a model of the same shape with other weights still equals HF."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from support.references import hf_last_logits
from support.tiny_models import save_tiny

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.backends.program_cache import CACHE_ENV

from .helpers import CHUNKED, VOCAB, prompt

# The first export of every test here: its programs, in a cache of its own, are copied into each test's cache.
BASE = dict(CHUNKED, context_buckets=(64,), prefill_buckets=(0, 16, 64))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Path, Path]:
    """(the tiny Llama of seed 11, the compile cache of its BASE export)."""
    root = tmp_path_factory.mktemp("program-cache")
    source = save_tiny(root / "hf", "llama", seed=11, vocab_size=VOCAB)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(CACHE_ENV, str(root / "cache"))
        NeuronModelForCausalLM.export(source, NeuronConfig(**BASE))
    return source, root / "cache"


def cache_after_base(base, tmp_path: Path, monkeypatch) -> Path:
    """A copy of the BASE export's cache, made the compile cache of this test."""
    cache = tmp_path / "cache"
    shutil.copytree(base[1], cache)
    monkeypatch.setenv(CACHE_ENV, str(cache))
    return cache


def test_a_second_model_of_the_same_shape_reuses_every_program(base, tmp_path, monkeypatch):
    cached = sorted(cache_after_base(base, tmp_path, monkeypatch).iterdir())
    config = NeuronConfig(**BASE)
    # two token_generation, chunk_and_decode and copy_prefix per context bucket, chunked_prefill per prefill bucket
    assert len(cached) == len(config.context_buckets) * 4 + len(config.prefill_buckets)

    def no_tracing(*args, **kwargs):
        raise AssertionError("a cached program was traced again")

    second = save_tiny(tmp_path / "hf-12", "llama", seed=12, vocab_size=VOCAB)
    monkeypatch.setattr(torch.export, "export", no_tracing)
    model = NeuronModelForCausalLM.export(second, config)
    assert sorted((tmp_path / "cache").iterdir()) == cached
    tokens = prompt(2 * CHUNKED["prefill_chunk_size"] + 3, seed=5)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(second, dtype=torch.float32).eval()
    torch.testing.assert_close(model.prefill(0, tokens), hf_last_logits(hf, tokens), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("change", [dict(batch_size=2), dict(max_topk=8), dict(sequence_length=32)])
def test_another_shape_is_compiled(base, tmp_path, monkeypatch, change):
    before = set(cache_after_base(base, tmp_path, monkeypatch).iterdir())
    length = change.get("sequence_length", 64)
    config = {**BASE, "context_buckets": (length,), "prefill_buckets": (0, 16, length), **change}
    NeuronModelForCausalLM.export(base[0], NeuronConfig(**config))
    assert set((tmp_path / "cache").iterdir()) > before
