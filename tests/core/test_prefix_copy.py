"""copy_prefix (prefix caching from a busy slot): positions [0, n) of one slot's K/V copied into blocks of another's,
by the copy_prefix graph of the smallest context bucket >= n. The copied bytes equal the source's, every other block
keeps its own, and a prompt prefilled from n onward in the destination gives the logits and greedy tokens of a full
prefill (and of HF)."""

from __future__ import annotations

import json

import pytest
import torch
from support.references import hf_greedy, hf_last_logits

from optimum_neuron_plugin.config import NeuronConfig
from optimum_neuron_plugin.errors import InputError
from optimum_neuron_plugin.graphs import COPY_PREFIX, graph_specs

from .helpers import CHUNKED_LOGITS_LIGHT, SEQUENCE_LENGTH, CallLog, blocks_but, prompt, slot_blocks, slot_positions

MARKER = 7.0  # cache positions never written keep it


@pytest.fixture(scope="module")
def llama(zoo):
    """Tiny Llama, chunk 8, context buckets 16 and 64, host sampling (shared with test_prefill_tail)."""
    return zoo.artifact("llama", **CHUNKED_LOGITS_LIGHT)


def greedy_from(model, seq_id: int, tokens: list[int], start: int, steps: int) -> tuple[torch.Tensor, list[int]]:
    """Prefill tokens[start:] at `start` of slot seq_id, then greedy decode: the prefill logits and new tokens."""
    logits = model.prefill(seq_id, tokens[start:], start=start)
    out = [int(logits.argmax())]
    for step in range(steps - 1):
        out.append(model.decode([seq_id], [out[-1]], [len(tokens) + step]).tokens[0])
    return logits, out


@pytest.mark.parametrize("length", [13, 16, 21])
def test_a_copied_prefix_continues_like_a_full_prefill(llama, length):
    model = llama.model
    for cache in model.caches:
        cache.fill_(MARKER)
    shared = prompt(length + 3, seed=40)
    model.prefill(0, shared)
    before = [cache.clone() for cache in model.caches]
    with CallLog(model) as log:
        model.copy_prefix(0, 1, length)
    bucket = 16 if length <= 16 else SEQUENCE_LENGTH
    assert log.graphs_and_buckets == [(COPY_PREFIX, bucket)]
    assert not set(slot_blocks(model, 1).tolist()) & set(slot_blocks(model, 0, 2).tolist())  # blocks of its own
    untouched = blocks_but(model, 1)  # the other slots', the free ones and the null block
    for cache, old in zip(model.caches, before, strict=True):
        source, copied = (slot_positions(model, cache, s)[:length] for s in (0, 1))
        assert torch.equal(copied, source)
        assert not torch.equal(copied, torch.full_like(copied, MARKER))
        assert torch.equal(cache[untouched], old[untouched])

    tokens = shared[:length] + prompt(9, seed=41)
    logits, out = greedy_from(model, 1, tokens, length, steps=5)
    full_logits, full_out = greedy_from(model, 2, tokens, 0, steps=5)
    torch.testing.assert_close(logits, full_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, hf_last_logits(llama.hf, tokens), atol=1e-4, rtol=1e-4)
    assert out == full_out == hf_greedy(llama.hf, tokens, 5)


def test_a_copy_onto_its_own_slot_changes_nothing_and_bad_slots_are_refused(llama):
    model = llama.model
    model.prefill(0, prompt(12, seed=42))
    before = [cache.clone() for cache in model.caches]
    model.copy_prefix(0, 0, 12)
    assert all(torch.equal(cache, kept) for cache, kept in zip(model.caches, before, strict=True))
    with pytest.raises(InputError, match="seq_id 3 is out of range"):
        model.copy_prefix(0, 3, 5)
    with pytest.raises(InputError, match="length 0 is out of range"):
        model.copy_prefix(0, 1, 0)


def test_an_artifact_written_without_copy_graphs_loads_without_them(tmp_path, llama):
    """neuron_config.json without prefix_copy (an export from before the graph existed): no copy graph is expected."""
    data = json.loads((llama.path / "neuron_config.json").read_text())
    assert data["prefix_copy"] is True
    del data["prefix_copy"]
    (tmp_path / "neuron_config.json").write_text(json.dumps(data))
    config = NeuronConfig.load(tmp_path)
    assert config.prefix_copy is False
    assert COPY_PREFIX not in {spec.name for spec in graph_specs(config, 512)}
    assert NeuronConfig(batch_size=2, sequence_length=32, prefill_chunk_size=0).prefix_copy is False
