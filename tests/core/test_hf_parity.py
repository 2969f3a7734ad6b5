"""Greedy tokens and logits match Hugging Face transformers (fp32) for every supported architecture."""

from __future__ import annotations

import pytest
import torch
from support.references import hf_greedy, hf_last_logits
from support.references import runtime_greedy as greedy
from support.tiny_models import ARCHITECTURES, quick_first

from optimum_neuron_plugin.models.args import ModelArgs
from optimum_neuron_plugin.models.layers import rope_inv_freq

from .helpers import CHUNK, CHUNK_ONE, CHUNKED_LOGITS, chunked_shape, prompt

NEW_TOKENS = 12
# Shorter than one chunk, exactly one chunk, several chunks with a remainder (2 x 8 + 3).
LENGTHS = {"short": CHUNK - 3, "one_chunk": CHUNK, "chunks_and_remainder": 2 * CHUNK + 3}


def chunked(zoo, name):
    # The Llama chunked artifact samples on the host (its token_generation returns logits), as the HOST_SAMPLING
    # families' do (helpers.chunked_shape): the other architectures cover greedy on device.
    if name == "llama":
        return zoo.artifact("llama", **CHUNKED_LOGITS)
    return zoo.artifact(name, **chunked_shape(name))


@pytest.mark.parametrize("length", LENGTHS.values(), ids=LENGTHS.keys())
@pytest.mark.parametrize("name", quick_first(ARCHITECTURES))
def test_greedy_matches_hf(zoo, name, length):
    artifact = chunked(zoo, name)
    tokens = prompt(length, seed=length)
    assert greedy(artifact.model, tokens, NEW_TOKENS) == hf_greedy(artifact.hf, tokens, NEW_TOKENS)


@pytest.mark.parametrize("length", LENGTHS.values(), ids=LENGTHS.keys())
@pytest.mark.parametrize("name", quick_first(ARCHITECTURES))
def test_last_token_logits_close_to_hf(zoo, name, length):
    artifact = chunked(zoo, name)
    tokens = prompt(length, seed=100 + length)
    logits = artifact.model.prefill(0, tokens)
    assert logits.dtype == torch.float32 and logits.shape == (artifact.hf.config.vocab_size,)
    torch.testing.assert_close(logits, hf_last_logits(artifact.hf, tokens), atol=1e-3, rtol=0)


def test_decode_logits_close_to_hf(llama_logits):
    """token_generation logits (host-sampling artifact) at several decode steps, against HF's full forward."""
    model, hf = llama_logits.model, llama_logits.hf
    tokens = prompt(11, seed=7)
    model.prefill(1, tokens)
    for _ in range(4):
        next_token = hf_last_logits(hf, tokens).argmax().item()
        result = model.decode([1], [next_token], [len(tokens)])
        tokens.append(next_token)
        torch.testing.assert_close(result.logits[0], hf_last_logits(hf, tokens), atol=1e-3, rtol=0)
        assert result.tokens == [result.logits[0].argmax().item()]


def test_chunk_size_one_matches_hf(zoo):
    artifact = zoo.artifact("llama", **CHUNK_ONE)
    tokens = prompt(7, seed=11)
    assert greedy(artifact.model, tokens, NEW_TOKENS) == hf_greedy(artifact.hf, tokens, NEW_TOKENS)
    torch.testing.assert_close(
        artifact.model.prefill(0, tokens), hf_last_logits(artifact.hf, tokens), atol=1e-3, rtol=0
    )


@pytest.mark.parametrize("length", LENGTHS.values(), ids=LENGTHS.keys())
def test_chunked_and_context_encoding_agree(llama_logits, llama_context, length):
    tokens = prompt(length, seed=200 + length)
    via_chunks = greedy(llama_logits.model, tokens, NEW_TOKENS)
    assert via_chunks == greedy(llama_context.model, tokens, NEW_TOKENS)
    assert via_chunks == hf_greedy(llama_context.hf, tokens, NEW_TOKENS)
    torch.testing.assert_close(
        llama_context.model.prefill(2, tokens), hf_last_logits(llama_context.hf, tokens), atol=1e-3, rtol=0
    )


@pytest.mark.parametrize("name", quick_first(["qwen2", "qwen3"], quick=("qwen2",)))
def test_export_round_trip_changes_nothing(zoo, name):
    """The model export() returns and its save_pretrained / from_pretrained copy compute the same thing."""
    artifact = zoo.artifact(name, **chunked_shape(name))
    assert artifact.model.neuron_config == artifact.exported.neuron_config
    tokens = prompt(13, seed=3)
    assert torch.equal(artifact.exported.prefill(0, tokens), artifact.model.prefill(0, tokens))
    assert greedy(artifact.exported, tokens, 6) == greedy(artifact.model, tokens, 6)


def test_llama3_rope_scaling_matches_hf(zoo):
    """The llama3 rescaled frequencies equal HF's, and really differ from the unscaled ones at these sizes."""
    hf = zoo.tiny("llama3").hf
    args = ModelArgs.from_hf_config(hf.config.to_dict())
    assert args.rope_scaling is not None
    torch.testing.assert_close(rope_inv_freq(args), hf.model.rotary_emb.inv_freq.float(), atol=0, rtol=1e-6)
    unscaled = rope_inv_freq(ModelArgs(**{**args.to_dict(), "rope_scaling": None}))
    assert not torch.allclose(unscaled, rope_inv_freq(args))
