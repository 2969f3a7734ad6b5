"""chunk_and_decode: a prompt chunk and a decode batch in one graph call (runtime.prefill_and_decode).

It must be exactly the two calls it replaces: the same decode tokens and logits, the same prefill logits, the
same K/V written to the same cache rows, nothing else touched; and greedy generation of a request that decodes
while another prompt is prefilled chunk by chunk equals HF's, for both requests, across every context bucket.
"""

from __future__ import annotations

import pytest
import torch
from support.references import hf_greedy
from support.tiny_models import ARCHITECTURES, quick_first

from optimum_neuron_plugin.errors import InputError
from optimum_neuron_plugin.sampling import SamplingParams, make_generator

from .helpers import (
    CHUNK,
    CHUNKED,
    CHUNKED_LOGITS,
    CONTEXT_ENCODING,
    SEQUENCE_LENGTH,
    CallLog,
    assert_same_cache,
    chunked_shape,
    prompt,
    slot_positions,
)

# The chunk_and_decode bucket of each chunk of a 45-token prompt (chunks start at 0, 8, ..., 40: a prior-context
# bucket >= the start) while another request decodes from position 5 (its rows fit the same bucket), per ladder.
FUSED_BUCKETS = {(8, 16, 32, 64): [8, 8, 16, 32, 32, 64], (16, 64): [16, 16, 16, 64, 64, 64]}


def greedy_while_prefilling(model, decoding: list[int], prefilling: list[int], new_tokens: int, chunks: int = 1):
    """Slot 0 decodes `decoding` greedily while slot 2 prefills `prefilling`, `chunks` chunks per step (each step
    one prefill_and_decode call); then both decode together. Returns each slot's first new_tokens tokens."""
    a = [int(model.prefill(0, decoding).argmax())]
    step = CHUNK * chunks
    for offset in range(0, len(prefilling), step):
        position = len(decoding) + len(a) - 1
        logits, result = model.prefill_and_decode(
            2, prefilling[offset : offset + step], offset, [0], [a[-1]], [position]
        )
        a += result.tokens
    b = [int(logits.argmax())]
    while min(len(a), len(b)) < new_tokens:
        result = model.decode([0, 2], [a[-1], b[-1]], [len(decoding) + len(a) - 1, len(prefilling) + len(b) - 1])
        a.append(result.tokens[0])
        b.append(result.tokens[1])
    return a[:new_tokens], b[:new_tokens]


def test_the_artifact_has_one_chunk_and_decode_graph_per_bucket(zoo):
    model = zoo.artifact("llama", **CHUNKED).model
    buckets = [spec.bucket for spec in model.specs if spec.name == "chunk_and_decode"]
    assert buckets == list(model.neuron_config.context_buckets) and model.fuses_prefill_and_decode


@pytest.mark.parametrize("name", quick_first(ARCHITECTURES))
def test_decoding_while_another_prompt_prefills_matches_hf_in_every_bucket(zoo, name):
    """The decoding request goes from position 5 to 50 (buckets 8 to 64) and the 45-token prompt's chunks start in
    every bucket too: each chunk_and_decode graph runs, and both requests' tokens are HF's. Llama and Gemma 3 have
    every bucket, the others the light ladder (16, 64)."""
    artifact = zoo.artifact(name, **chunked_shape(name))
    decoding, prefilling = prompt(5, seed=50), prompt(45, seed=51)
    with CallLog(artifact.model) as log:
        a, b = greedy_while_prefilling(artifact.model, decoding, prefilling, 12)
    assert a == hf_greedy(artifact.hf, decoding, 12)
    assert b == hf_greedy(artifact.hf, prefilling, 12)
    fused = [bucket for name, bucket in log.graphs_and_buckets if name == "chunk_and_decode"]
    assert fused == FUSED_BUCKETS[artifact.model.neuron_config.context_buckets]
    assert set(fused) == set(artifact.model.neuron_config.context_buckets)  # every chunk_and_decode graph ran


@pytest.mark.parametrize("config", [CHUNKED_LOGITS, CHUNKED], ids=["host-sampling", "on-device-sampling"])
def test_one_fused_call_writes_and_returns_what_the_two_calls_do(zoo, config):
    """`exported` runs decode then prefill, `model` (the same artifact loaded back) one prefill_and_decode of a
    two-chunk slice that starts mid-prompt: same outputs, same cache contents, every other position untouched.
    A decode row at position 21 needs bucket 32: the batch rides in the second chunk (positions 16..23)."""
    artifact = zoo.artifact("llama", **config)
    separate, fused = artifact.exported, artifact.model
    first, second, rest = prompt(21, seed=60), prompt(9, seed=61), prompt(30, seed=62)
    for model in (separate, fused):
        for cache in model.caches:
            cache.fill_(7.0)  # a marker: positions never written keep it
        model.prefill(0, first)
        model.prefill(1, second)
        model.prefill(2, rest[:8])
    decode = ([0, 1], [3, 4], [21, 9])
    expected = separate.decode(*decode)
    expected_logits = separate.prefill(2, rest[8:24], start=8)
    with CallLog(fused) as log:
        logits, result = fused.prefill_and_decode(2, rest[8:24], 8, *decode)
    assert log.graphs_and_buckets == [("chunked_prefill", 8), ("chunk_and_decode", 32)]  # prior bucket 8: start 8
    assert result.tokens == expected.tokens
    if expected.logits is not None:
        torch.testing.assert_close(result.logits, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-5)
    assert_same_cache(fused, separate, 7.0)
    for got in fused.caches:
        for slot, end in ((0, 22), (1, 10), (2, 24)):
            assert (slot_positions(fused, got, slot)[end:] == 7.0).all()


def test_a_chunk_whose_bucket_is_smaller_than_the_decode_rows_needs_is_not_fused(zoo):
    """A request decoding at positions 40+ (bucket 64) while an 8-token prompt prefills (its context bucket 8): fusing
    would make the chunk attend 64 prior positions, so the two graphs run, and both requests still get HF's tokens."""
    artifact = zoo.artifact("llama", **CHUNKED)
    decoding, prefilling = prompt(40, seed=80), prompt(8, seed=81)
    with CallLog(artifact.model) as log:
        a, b = greedy_while_prefilling(artifact.model, decoding, prefilling, 4)
    calls = log.graphs_and_buckets
    assert (a, b) == (hf_greedy(artifact.hf, decoding, 4), hf_greedy(artifact.hf, prefilling, 4))
    # After the decoding prompt's own 5 chunks: the decode step, then the prompt's chunk on its own.
    assert calls[5:7] == [("token_generation", 64), ("chunked_prefill", 0)]
    assert "chunk_and_decode" not in {name for name, _ in calls}


def test_an_artifact_without_the_fused_graph_runs_the_two_calls(zoo):
    """Context encoding has no chunk_and_decode graph: prefill_and_decode is decode, then the prefill."""
    artifact = zoo.artifact("llama", **CONTEXT_ENCODING)
    assert not artifact.model.fuses_prefill_and_decode
    decoding, prefilling = prompt(6, seed=70), prompt(20, seed=71)
    a, b = greedy_while_prefilling(artifact.model, decoding, prefilling, 5, chunks=SEQUENCE_LENGTH // CHUNK)
    assert (a, b) == (hf_greedy(artifact.hf, decoding, 5), hf_greedy(artifact.hf, prefilling, 5))


def test_a_slot_cannot_prefill_and_decode_in_the_same_call(zoo):
    model = zoo.artifact("llama", **CHUNKED).model
    with pytest.raises(InputError, match="slot 1 cannot prefill and decode in the same call"):
        model.prefill_and_decode(1, [1, 2, 3], 0, [0, 1], [5, 6], [4, 4])


def test_a_fused_call_that_raises_leaves_the_generators_as_they_were(zoo):
    """A prompt id beyond the embedding table makes the graph raise; the decode rows' seeded generators must not have
    advanced, so the runner's retry of the decode batch alone draws what it would have drawn."""
    model = zoo.artifact("llama", **CHUNKED).model
    model.prefill(0, prompt(6, seed=90))
    generator = make_generator(7)
    before = generator.get_state()
    sampling = [SamplingParams(temperature=1.0, top_k=50)]
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the backend raises for an out-of-range id
        model.prefill_and_decode(1, [10**6] * 8, 0, [0], [5], [6], sampling, [generator])
    assert torch.equal(generator.get_state(), before)
