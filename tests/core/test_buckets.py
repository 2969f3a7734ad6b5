"""Buckets: a call runs the graph of the smallest bucket holding its context, the graph of bucket L reads cache
positions [0, L) only, and greedy decoding across bucket edges equals HF's.

The tiny artifacts have sequence length 64 and chunk 8: context buckets 8, 16, 32, 64 (decode, chunk_and_decode)
and prefill buckets 0, 8, 16, 24, 32, 48, 64 (chunked_prefill: a chunk's prior context)."""

from __future__ import annotations

import pytest
import torch
from support.references import hf_greedy
from support.references import runtime_greedy as greedy
from support.tiny_models import ARCHITECTURES, quick_first

from optimum_neuron_plugin import NeuronConfig
from optimum_neuron_plugin.config import NeuronConfigError, default_context_buckets, default_prefill_buckets

from .helpers import CHUNKED, CHUNKED_LOGITS_LIGHT, CallLog, chunked_shape, fill_positions, prompt

BUCKETS = (8, 16, 32, 64)
PREFILL_BUCKETS = (0, 8, 16, 24, 32, 48, 64)
# token_generation finer than the light export's context buckets (16, 64).
DECODE_BUCKETS = (8, 12, 16, 24, 32, 40, 64)
FINE_DECODE = dict(CHUNKED_LOGITS_LIGHT, decode_buckets=DECODE_BUCKETS)


def test_default_buckets_double_from_the_chunk_to_the_sequence_length():
    assert NeuronConfig(sequence_length=64, prefill_chunk_size=8).context_buckets == BUCKETS
    assert default_context_buckets(2048, 256) == (256, 512, 1024, 2048)
    assert default_context_buckets(8192, 256) == (1024, 2048, 4096, 8192)  # the largest four
    assert default_context_buckets(4096, 0) == (512, 1024, 2048, 4096)  # no chunking: from 512
    assert default_context_buckets(300, 256) == (256, 300)
    assert default_context_buckets(256, 256) == (256,)


def test_default_prefill_buckets_are_chunk_multiples_in_half_octaves_from_zero():
    assert NeuronConfig(sequence_length=64, prefill_chunk_size=8).prefill_buckets == PREFILL_BUCKETS
    assert default_prefill_buckets(4096, 512) == (0, 512, 1024, 1536, 2048, 3072, 4096)
    assert default_prefill_buckets(8192, 512) == (0, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
    # At most 10 nonzero: the smallest multiples go first.
    assert default_prefill_buckets(32768, 512) == (0, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
    assert default_prefill_buckets(3000, 512) == (0, 512, 1024, 1536, 2048, 3000)
    assert default_prefill_buckets(512, 512) == (0, 512)
    assert NeuronConfig(sequence_length=64, prefill_chunk_size=0).prefill_buckets == ()


@pytest.mark.parametrize(
    "buckets, allowed",
    [((8, 64), "starting with 0"), ((0, 16, 8, 64), "strictly increasing"), ((0, 32), "ending with sequence_length")],
)
def test_bad_prefill_buckets_say_what_is_allowed(buckets, allowed):
    with pytest.raises(NeuronConfigError) as error:
        NeuronConfig(sequence_length=64, prefill_chunk_size=8, prefill_buckets=buckets)
    assert "prefill_buckets" in str(error.value) and allowed in str(error.value)
    with pytest.raises(NeuronConfigError, match="without chunked prefill"):
        NeuronConfig(sequence_length=64, prefill_chunk_size=0, prefill_buckets=(0, 64))


@pytest.mark.parametrize(
    "buckets, allowed",
    [((16, 8, 64), "strictly increasing"), ((8, 32), "ending with sequence_length (64)"), ((0, 64), "positive")],
)
def test_bad_buckets_say_what_is_allowed(buckets, allowed):
    with pytest.raises(NeuronConfigError) as error:
        NeuronConfig(sequence_length=64, prefill_chunk_size=8, context_buckets=buckets)
    assert "context_buckets" in str(error.value) and allowed in str(error.value)


def test_decode_buckets_default_to_the_context_buckets_and_say_what_is_allowed():
    assert NeuronConfig(sequence_length=64, prefill_chunk_size=8).decode_buckets == BUCKETS
    assert NeuronConfig(sequence_length=64, prefill_chunk_size=8, context_buckets=(16, 64)).decode_buckets == (16, 64)
    fine = NeuronConfig(sequence_length=64, prefill_chunk_size=8, decode_buckets=(12, 40, 64))
    assert fine.decode_buckets == (12, 40, 64) and fine.context_buckets == BUCKETS
    for buckets, allowed in [((40, 12, 64), "strictly increasing"), ((12, 40), "ending with sequence_length (64)")]:
        with pytest.raises(NeuronConfigError) as error:
            NeuronConfig(sequence_length=64, prefill_chunk_size=8, decode_buckets=buckets)
        assert f"decode_buckets={list(buckets)!r}" in str(error.value) and allowed in str(error.value)


def test_decode_runs_the_smallest_decode_bucket_and_the_rest_the_context_buckets(zoo):
    """token_generation is compiled per decode bucket only, the other graphs per context bucket; a decode
    call runs the smallest decode bucket holding its longest row, a chunk_and_decode call a context bucket."""
    artifact = zoo.artifact("llama", **FINE_DECODE)
    model = artifact.model
    buckets = lambda name: sorted({spec.bucket for spec in model.specs if spec.name == name})  # noqa: E731
    assert buckets("token_generation") == list(DECODE_BUCKETS)
    assert buckets("chunk_and_decode") == buckets("copy_prefix") == [16, 64]
    for last, bucket in [(7, 8), (8, 12), (11, 12), (12, 16), (23, 24), (33, 40), (40, 64)]:
        assert model.select("token_generation", 2, (), [0, last]).bucket == bucket
    assert model.select("chunk_and_decode", 1, [8], [20]).bucket == 64


def test_fine_decode_buckets_decode_what_hf_does_and_read_only_their_bucket(zoo):
    """A short prompt decoded across every decode bucket gives HF's tokens; garbage in cache positions 12.. leaves a
    decode at position 11 (decode bucket 12) unchanged bit for bit, where the context bucket would read to 16."""
    artifact = zoo.artifact("llama", **FINE_DECODE)
    model, short = artifact.model, prompt(5, seed=43)
    with CallLog(model) as log:
        assert greedy(model, short, 55) == hf_greedy(artifact.hf, short, 55)
    assert {bucket for graph, bucket, _ in log.calls if graph == "token_generation"} == set(DECODE_BUCKETS)

    tokens = prompt(11, seed=44)
    model.prefill(2, tokens)
    clean = model.decode([2], [3], [11]).logits
    for cache in model.caches:
        fill_positions(model, cache, 2, 12, 1e4)
    model.prefill(2, tokens)
    torch.testing.assert_close(model.decode([2], [3], [11]).logits, clean, atol=0, rtol=0)


@pytest.mark.parametrize("last, bucket", [(0, 8), (7, 8), (8, 16), (15, 16), (16, 32), (31, 32), (32, 64), (63, 64)])
def test_a_call_up_to_position_p_reads_the_smallest_bucket_holding_position_p(zoo, last, bucket):
    """A row whose last position is p writes it, then attends cache positions [0, p]: bucket L serves
    p = L - 1, not p = L."""
    model = zoo.artifact("llama", **CHUNKED).model
    assert model.select("token_generation", 1, (), [last]).bucket == bucket
    # Every row must fit: the longest one decides.
    assert model.select("token_generation", 3, (), [0, last, 3]).bucket == bucket


@pytest.mark.parametrize("start, bucket", [(0, 0), (1, 8), (8, 8), (9, 16), (24, 24), (25, 32), (33, 48), (56, 64)])
def test_a_chunk_starting_at_s_reads_the_smallest_prefill_bucket_holding_its_prior_context(zoo, start, bucket):
    """A chunk at [s, s + C) attends cache positions [0, s) and its own block: bucket P serves s = P, the
    bucket-0 graph the first chunks (they attend only themselves)."""
    model = zoo.artifact("llama", **CHUNKED).model
    assert model.select("chunked_prefill", 1, [start], [start + 7]).bucket == bucket


def test_the_chunk_loop_and_decode_use_the_buckets_at_their_edges(zoo):
    model = zoo.artifact("llama", **CHUNKED).model
    with CallLog(model) as log:
        model.prefill(0, prompt(20, seed=1))  # chunks start at positions 0, 8, 16
        model.decode([0], [5], [15])  # positions 0..15 fit bucket 16
        model.decode([0], [5], [16])  # position 16 needs bucket 32
    assert log.calls == [
        ("chunked_prefill", 0, 7),
        ("chunked_prefill", 8, 15),
        ("chunked_prefill", 16, 19),
        ("token_generation", 16, 15),
        ("token_generation", 32, 16),
    ]


def test_a_bucket_graph_never_reads_past_its_bucket_nor_attends_past_its_position(zoo):
    """Garbage in the slot's cache positions 17.. changes neither a decode at 14 (bucket 16: never read)
    nor a chunk at 15..16 (prefill bucket 16: positions 15.. masked, 16.. never read), bit for bit."""
    model = zoo.artifact("llama", **CHUNKED).model
    tokens = prompt(14, seed=2)
    model.prefill(1, tokens)
    clean = model.decode([1], [3], [14]).tokens, model.prefill(1, [4, 5], start=15)
    for cache in model.caches:
        fill_positions(model, cache, 1, 17, 1e4)  # beyond bucket 16, past everything written so far
    model.prefill(1, tokens)
    dirty = model.decode([1], [3], [14]).tokens, model.prefill(1, [4, 5], start=15)
    assert clean[0] == dirty[0]
    torch.testing.assert_close(clean[1], dirty[1], atol=0, rtol=0)


@pytest.mark.parametrize("name", quick_first(ARCHITECTURES))
def test_every_bucket_graph_of_every_architecture_matches_hf(zoo, name):
    """A short prompt decoded far (decode buckets 8, 16, 32, 64) and a long prompt (prefill buckets 0 to 64: its
    chunks start at 0, 8, ..., 56). Llama and Gemma 3 have every bucket, the others the light ladder (16, 64)."""
    artifact = zoo.artifact(name, **chunked_shape(name))
    short, long = prompt(5, seed=40), prompt(57, seed=41)
    with CallLog(artifact.model) as log:
        assert greedy(artifact.model, short, 50) == hf_greedy(artifact.hf, short, 50)
        assert greedy(artifact.model, long, 4) == hf_greedy(artifact.hf, long, 4)
    used = {(graph, bucket) for graph, bucket, _ in log.calls}
    # chunk_and_decode's buckets: test_chunk_and_decode.py; copy_prefix's: test_prefix_copy.py.
    assert used == {
        (spec.name, spec.bucket)
        for spec in artifact.model.specs
        if spec.name not in ("chunk_and_decode", "copy_prefix")
    }
