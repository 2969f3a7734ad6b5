"""Tail graphs (prefill_tail_size T): a prompt's last piece of at most T tokens runs on a T-token chunked_prefill or
chunk_and_decode graph instead of a whole chunk. Same logits, tokens and cache bytes as the whole-chunk artifact and
HF, and the tail graph really runs."""

from __future__ import annotations

import pytest
import torch
from support.references import hf_greedy, hf_last_logits

from optimum_neuron_plugin import NeuronConfig
from optimum_neuron_plugin.config import NeuronConfigError

from .helpers import CHUNK, CHUNKED_LOGITS_LIGHT, CallLog, assert_same_cache, prompt, slot_positions

TAIL = 4
MARKER = 7.0  # cache positions never written keep it


@pytest.fixture(scope="module")
def tail(zoo):
    """Tiny Llama, chunk 8, tail graphs of 4 tokens, prompts prefilled 2 at a time; host sampling (decode logits)."""
    return zoo.artifact("llama", **CHUNKED_LOGITS_LIGHT, prefill_tail_size=TAIL, prefill_batch_size=2)


@pytest.fixture(scope="module")
def whole(zoo):
    """The same shape without tail graphs (shared with test_families)."""
    return zoo.artifact("llama", **CHUNKED_LOGITS_LIGHT)


def marked(*models) -> None:
    for model in models:
        for cache in model.caches:
            cache.fill_(MARKER)


def test_the_artifact_has_a_tail_graph_per_bucket(tail):
    specs = [s for s in tail.model.specs if s.tail]
    nc = tail.model.neuron_config
    assert [(s.key, s.prompt_tokens) for s in specs if s.name == "chunked_prefill"] == [
        (f"chunked_prefill_t{TAIL}_{b}", TAIL) for b in nc.prefill_buckets
    ]
    assert [s.key for s in specs if s.name == "chunk_and_decode"] == [
        f"chunk_and_decode_t{TAIL}_{b}" for b in nc.context_buckets
    ]


@pytest.mark.parametrize("length", [2 * CHUNK + 1, 2 * CHUNK + TAIL, 2 * CHUNK + TAIL + 1, 3 * CHUNK])
def test_a_last_piece_that_fits_the_tail_runs_on_it(tail, whole, length):
    """Same logits and cache bytes as whole chunks; the whole chunks share a call (prefill batch 2), the last piece
    runs on the tail graph when it fits."""
    tokens = prompt(length, seed=length)
    marked(tail.model, whole.model)
    with CallLog(tail.model) as log:
        logits = tail.model.prefill(1, tokens)
    expected = whole.model.prefill(1, tokens)
    last = TAIL if length % CHUNK and length % CHUNK <= TAIL else CHUNK
    assert log.graphs_rows_and_tokens == [("chunked_prefill", 2, CHUNK), ("chunked_prefill", 1, last)]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, hf_last_logits(tail.hf, tokens), atol=1e-4, rtol=1e-4)
    assert_same_cache(tail.model, whole.model, MARKER)
    for got in tail.model.caches:
        assert (slot_positions(tail.model, got, 1)[length:] == MARKER).all()


def test_a_prefix_hit_prefills_its_question_in_one_tail_call(tail):
    """The question after a hit mid-chunk (start 19, prior bucket 64) is one tail call; tokens are HF's."""
    model = tail.model
    held = prompt(30, seed=5)
    model.prefill(0, held)
    asked = held[:19] + prompt(3, seed=6)
    with CallLog(model) as log:
        logits = model.prefill(0, asked[19:], start=19)
    assert [(s.name, s.prompt_tokens, s.bucket) for s in log.specs] == [("chunked_prefill", TAIL, 64)]
    torch.testing.assert_close(logits, hf_last_logits(tail.hf, asked), atol=1e-4, rtol=1e-4)
    out, position = [int(logits.argmax())], len(asked)
    while len(out) < 6:
        out.append(int(model.decode([0], [out[-1]], [position]).logits[0].argmax()))
        position += 1
    assert out == hf_greedy(tail.hf, asked, 6)


def test_a_tail_chunk_rides_with_the_decode_batch(tail):
    """prefill_and_decode of a 3-token piece: one chunk_and_decode tail call, the same outputs and cache bytes as
    the decode and the prefill apart (`exported`: the same artifact before its round trip)."""
    separate, fused = tail.exported, tail.model
    first, rest = prompt(21, seed=60), prompt(19, seed=62)
    marked(separate, fused)
    for model in (separate, fused):
        model.prefill(0, first)
        model.prefill(2, rest[:16])
    decode = ([0], [3], [21])  # context bucket 64, as the piece at 16..18
    expected = separate.decode(*decode)
    expected_logits = separate.prefill(2, rest[16:], start=16)
    with CallLog(fused) as log:
        logits, result = fused.prefill_and_decode(2, rest[16:], 16, *decode)
    assert [(s.name, s.prompt_tokens, s.tail) for s in log.specs] == [("chunk_and_decode", TAIL, True)]
    torch.testing.assert_close(result.logits, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, hf_last_logits(tail.hf, rest), atol=1e-4, rtol=1e-4)
    assert_same_cache(fused, separate, MARKER)


def test_prompts_prefilled_together_run_their_tails_alone(tail):
    """The whole chunks, in order of offset, share calls of up to 2; each piece that fits the tail then runs on it."""
    prompts = [prompt(n, seed=70 + n) for n in (20, 11, 3)]
    with CallLog(tail.model) as log:
        logits = tail.model.prefill_batch([(slot, p, 0) for slot, p in enumerate(prompts)])
    assert log.graphs_rows_and_tokens == [
        ("chunked_prefill", 2, CHUNK),  # the first chunks of the 20- and the 11-token prompts
        ("chunked_prefill", 1, CHUNK),  # the 20-token prompt's second chunk
        ("chunked_prefill", 1, TAIL),  # the 3-token prompt
        ("chunked_prefill", 1, TAIL),  # the 11-token prompt's last 3
        ("chunked_prefill", 1, TAIL),  # the 20-token prompt's last 4
    ]
    for p, row in zip(prompts, logits, strict=True):
        torch.testing.assert_close(row, hf_last_logits(tail.hf, p), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(prefill_chunk_size=8, prefill_tail_size=8), "below prefill_chunk_size"),
        (dict(prefill_chunk_size=0, prefill_tail_size=4), "below prefill_chunk_size with chunked prefill"),
        (dict(prefill_chunk_size=8, prefill_tail_size=-1), "an integer >= 0"),
    ],
)
def test_bad_tail_sizes_are_refused(config, message):
    with pytest.raises(NeuronConfigError, match=message):
        NeuronConfig(batch_size=2, sequence_length=64, **config)
