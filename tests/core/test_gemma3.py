"""Gemma 3 equals Hugging Face eager at every step of a teacher-forced sequence that crosses the sliding window and
the context buckets: prefill in chunks, then decode steps (one row, a batch, a batch riding in a chunk).

The tiny model (support.tiny_models.GEMMA3): a sliding layer (window 6, rope base 100) then a full layer (base
10000), q/k norms, (1 + w) norms and sandwich norms with weights away from 0, scaled embeddings,
query_pre_attn_scalar 24, gelu, final logit softcapping 5. Buckets 8, 16, 32, 64: a chunk (8 tokens) reads a window
of 13 positions and a decode step one of 6 from bucket 16 (decode: 8) on, the whole bucket below.
"""

from __future__ import annotations

import pytest
import torch
from support.references import hf_greedy, hf_next_logits
from support.references import runtime_greedy as greedy
from support.tiny_models import GEMMA3

from optimum_neuron_plugin import NeuronConfig
from optimum_neuron_plugin.models import masks
from optimum_neuron_plugin.models.args import ModelArgs

from .helpers import CHUNKED, CHUNKED_LOGITS, prompt

ATOL = 1e-4
LENGTH = 60  # teacher-forced tokens: every bucket edge (8, 16, 32) and many windows
# Prefill calls of these sizes (a call of up to 8 tokens is one chunk), then one decode step per token.
PREFILL_CALLS = [5, 8, 3, 8, 7]  # ends at position 30, crossing bucket edges 8 and 16 mid-call


@pytest.fixture(scope="module")
def gemma(zoo):
    artifact = zoo.artifact("gemma3", **CHUNKED_LOGITS)
    artifact.hf.set_attn_implementation("eager")
    return artifact


def reference(hf, tokens: list[int]) -> torch.Tensor:
    return hf_next_logits(hf, [tokens])[0]  # [length, vocab]: the logits after every prefix


def test_the_tiny_model_slides_and_keeps_its_features(gemma):
    args = gemma.model.args
    assert [args.is_sliding(i) for i in range(2)] == [True, False] and args.sliding_window == 6
    assert args.sliding_rope_theta == 100.0 and args.rope_theta == 10000.0
    assert args.final_logit_softcapping == 5.0 and args.attention_scale == 24**-0.5
    norms = [w for n, w in gemma.hf.named_parameters() if "norm" in n]
    assert all((w - 1).abs().max() < 0.5 and w.std() > 0.01 for w in norms)  # (1 + w) with w near 1, not 0


def test_teacher_forced_chunks_then_decode_equal_hf(gemma):
    model, tokens = gemma.model, prompt(LENGTH, seed=31)
    expected = reference(gemma.hf, tokens)
    start = 0
    for size in PREFILL_CALLS:
        logits = model.prefill(0, tokens[start : start + size], start)
        start += size
        torch.testing.assert_close(logits, expected[start - 1], atol=ATOL, rtol=0, msg=f"prefill to {start}")
    for position in range(start, LENGTH):
        result = model.decode([0], [tokens[position]], [position])
        torch.testing.assert_close(result.logits[0], expected[position], atol=ATOL, rtol=0, msg=f"decode {position}")


def test_batched_decode_at_different_positions_equals_hf(gemma):
    """Three slots decoding together (the batch graph attends every cache row in slot order) at positions in
    different buckets and windows."""
    model = gemma.model
    sequences = [prompt(LENGTH, seed=40 + s) for s in range(3)]
    starts = [9, 27, 3]
    expected = [reference(gemma.hf, seq) for seq in sequences]
    for slot, (seq, start) in enumerate(zip(sequences, starts, strict=True)):
        model.prefill(slot, seq[:start])
    for step in range(LENGTH - max(starts)):
        positions = [start + step for start in starts]
        result = model.decode([0, 1, 2], [seq[p] for seq, p in zip(sequences, positions, strict=True)], positions)
        for slot, position in enumerate(positions):
            torch.testing.assert_close(result.logits[slot], expected[slot][position], atol=ATOL, rtol=0)


def test_decode_riding_in_a_chunk_equals_hf(gemma):
    """chunk_and_decode: a prompt's chunks with two slots decoding in the same calls."""
    model = gemma.model
    decoding = [prompt(LENGTH, seed=50 + s) for s in range(2)]
    chunked = prompt(24, seed=52)
    expected = [reference(gemma.hf, seq) for seq in decoding]
    for slot, seq in enumerate(decoding):
        model.prefill(slot, seq[:20])
    positions = [20, 20]
    for offset in range(0, len(chunked), 8):
        decode_tokens = [seq[p] for seq, p in zip(decoding, positions, strict=True)]
        chunk_logits, result = model.prefill_and_decode(
            2, chunked[offset : offset + 8], offset, [0, 1], decode_tokens, positions
        )
        for slot, position in enumerate(positions):
            torch.testing.assert_close(result.logits[slot], expected[slot][position], atol=ATOL, rtol=0)
        torch.testing.assert_close(chunk_logits, reference(gemma.hf, chunked[: offset + 8])[-1], atol=ATOL, rtol=0)
        positions = [p + 1 for p in positions]


@pytest.mark.parametrize("length", [5, 29])
def test_greedy_on_device_equals_hf(zoo, length):
    artifact = zoo.artifact("gemma3", **CHUNKED)
    tokens = prompt(length, seed=60 + length)
    assert greedy(artifact.model, tokens, 30) == hf_greedy(artifact.hf, tokens, 30)


def test_window_read_holds_every_attended_key():
    """The sliding layers' window read, against the mask over the whole bucket: same keys attended."""
    window, bucket = 6, 32
    positions = torch.tensor(
        [[0, 1, 2, 3, 4, 5, 6, 7], [20, 21, 22, 23, 24, 25, 25, 25], [9, 10, 11, 12, 13, 14, 15, 16]]
    )
    span = window - 1 + positions.shape[1]
    starts = masks.window_starts(positions, window, span, bucket)
    read = masks.cache_mask(positions, span, window, starts)
    whole = masks.cache_mask(positions, bucket, window)
    for row in range(3):
        keys = starts[row] + torch.arange(span)
        assert torch.equal(whole[row][:, keys], read[row])
        assert whole[row].sum() == read[row].sum()  # nothing attended outside the span


def test_mixed_layers_export_past_the_window_every_layer_sliding_is_refused(zoo):
    args = ModelArgs.from_hf_config(zoo.tiny("gemma3").hf.config.to_dict())
    assert args.has_sliding_layers and not args.every_layer_slides
    mistral = ModelArgs.from_hf_config({**zoo.tiny("mistral").hf.config.to_dict(), "sliding_window": 16})
    assert mistral.every_layer_slides
    from optimum_neuron_plugin.errors import ExportError
    from optimum_neuron_plugin.runtime.artifact_io import check_model as _check_model

    _check_model(NeuronConfig(**CHUNKED), args)  # sequence length 64, window 6
    with pytest.raises(ExportError, match=r"sequence_length=64 exceeds the model's sliding window \(16\)"):
        _check_model(NeuronConfig(**CHUNKED), mistral)


def test_rope_frequencies_of_each_layer_kind_equal_hf():
    """Each layer kind's frequencies, the full layers' linear scaling included (Gemma 3 4B and larger)."""
    from support.tiny_models import tiny_model

    from optimum_neuron_plugin.models.layers import rope_inv_freq

    scaled = {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0}
    hf = tiny_model("gemma3", rope_parameters={**GEMMA3["rope_parameters"], "full_attention": scaled})
    args = ModelArgs.from_hf_config(hf.config.to_dict())
    rotary = hf.model.rotary_emb
    torch.testing.assert_close(rope_inv_freq(args, sliding=True), rotary.sliding_attention_inv_freq, atol=0, rtol=1e-6)
    torch.testing.assert_close(rope_inv_freq(args), rotary.full_attention_inv_freq, atol=0, rtol=1e-6)
    assert not torch.allclose(rope_inv_freq(args), rope_inv_freq(args, sliding=True))
