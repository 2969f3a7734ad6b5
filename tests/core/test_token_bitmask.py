"""Structured outputs on device: token_generation and chunk_and_decode mask a packed token bitmask before sampling.

The bitmask is xgrammar's layout, the one vLLM's scheduler sends (bit j of int32 word i allows token 32 * i + j).
References: xgrammar's own apply_token_bitmask_inplace (what vLLM applies to host logits) and HF's logits.
"""

from __future__ import annotations

import pytest
import torch
import xgrammar
from support.references import hf_last_logits

from optimum_neuron_plugin import NeuronModelForCausalLM
from optimum_neuron_plugin.errors import InputError
from optimum_neuron_plugin.models.masks import MASK_FILL
from optimum_neuron_plugin.models.sampling import bitmask_words, mask_disallowed
from optimum_neuron_plugin.sampling import SamplingParams, make_generator

from .helpers import CHUNK, CHUNKED, VOCAB, prompt

ALLOWED_SHARE = 0.1


def random_bitmask(rows: int, vocab: int, seed: int, share: float = ALLOWED_SHARE) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed int32 [rows, ceil(vocab / 32)], allowed bool [rows, vocab]) with about `share` of the tokens allowed."""
    allowed = torch.rand(rows, vocab, generator=torch.Generator().manual_seed(seed)) < share
    allowed[:, 0] = True  # never an empty row
    return pack(allowed), allowed


def pack(allowed: torch.Tensor) -> torch.Tensor:
    rows, vocab = allowed.shape
    bits = torch.zeros(rows, bitmask_words(vocab) * 32, dtype=torch.int64)
    bits[:, :vocab] = allowed.long()
    words = (bits.view(rows, -1, 32) << torch.arange(32)).sum(-1)
    return words.to(torch.int64).where(words < 2**31, words - 2**32).to(torch.int32)


def test_mask_matches_xgrammar_on_every_vocabulary_slice():
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))
    packed = torch.randint(-(2**31), 2**31 - 1, (3, bitmask_words(1000)), dtype=torch.int32)
    expected = logits.clone()
    xgrammar.apply_token_bitmask_inplace(expected, packed)
    masked = mask_disallowed(logits, packed)
    assert torch.equal(masked == MASK_FILL, torch.isneginf(expected))
    assert torch.equal(masked[~torch.isneginf(expected)], logits[~torch.isneginf(expected)])
    # Under tensor parallelism each rank masks its slice of 256 ids (the last one padded past the vocabulary).
    slices = [mask_disallowed(logits[:, r * 256 : (r + 1) * 256], packed, torch.tensor([r * 256])) for r in range(4)]
    assert torch.equal(torch.cat(slices, dim=-1), masked)
    assert torch.equal(mask_disallowed(logits, torch.full_like(packed, -1)), logits)


@pytest.fixture(scope="module")
def chunked(zoo):
    return zoo.artifact("llama", **CHUNKED)


def prefilled(model: NeuronModelForCausalLM, hf, lengths: list[int]) -> tuple[list[list[int]], list[int]]:
    """Prompts prefilled in slots 0..n-1, and each one's HF greedy first token."""
    prompts = [prompt(n, seed=40 + i) for i, n in enumerate(lengths)]
    firsts = [int(model.prefill(slot, p).argmax()) for slot, p in enumerate(prompts)]
    return [p + [t] for p, t in zip(prompts, firsts, strict=True)], firsts


def masked_argmax(hf, sequences: list[list[int]], allowed: torch.Tensor) -> list[int]:
    logits = torch.stack([hf_last_logits(hf, s) for s in sequences])
    return logits.masked_fill(~allowed, float("-inf")).argmax(-1).tolist()


@pytest.mark.parametrize("rows", [1, 3], ids=["one-row graph", "batch graph"])
def test_greedy_decode_is_the_masked_argmax_of_hf_logits(chunked, rows):
    model, hf = chunked.model, chunked.hf
    sequences, firsts = prefilled(model, hf, [5, 11, 20][:rows])
    packed, allowed = random_bitmask(rows, VOCAB, seed=rows)
    if rows > 1:  # a row without a grammar: all ones
        packed[1], allowed[1] = -1, True
    positions = [len(s) - 1 for s in sequences]
    result = model.decode(list(range(rows)), firsts, positions, bitmask=packed)
    expected = masked_argmax(hf, sequences, allowed)
    assert result.tokens == expected
    unmasked = masked_argmax(hf, sequences, torch.ones_like(allowed))
    assert any(a != b for a, b in zip(expected, unmasked, strict=True))  # the mask changed something


def test_chunk_and_decode_masks_its_decode_rows(chunked):
    model, hf = chunked.model, chunked.hf
    sequences, firsts = prefilled(model, hf, [6, 9])
    packed, allowed = random_bitmask(2, VOCAB, seed=7)
    positions = [len(s) - 1 for s in sequences]
    chunk = prompt(CHUNK, seed=99)
    logits, result = model.prefill_and_decode(2, chunk, 0, [0, 1], firsts, positions, bitmask=packed)
    assert result.tokens == masked_argmax(hf, sequences, allowed)
    assert torch.allclose(logits, hf_last_logits(hf, chunk), atol=1e-4)  # the prompt row is not masked


def test_sampled_tokens_stay_in_the_allowed_set(chunked):
    model, hf = chunked.model, chunked.hf
    sequences, firsts = prefilled(model, hf, [7, 12])
    packed, allowed = random_bitmask(2, VOCAB, seed=11, share=0.02)
    hot = SamplingParams(top_k=0, top_p=1.0, temperature=5.0)
    generators = [make_generator(1), make_generator(2)]
    positions = [len(s) - 1 for s in sequences]
    drawn = set()
    for _ in range(20):  # the same step over and over: K/V rewritten in place, new uniforms each time
        result = model.decode([0, 1], firsts, positions, [hot, hot], generators, bitmask=packed)
        drawn |= {(row, token) for row, token in enumerate(result.tokens)}
    assert all(allowed[row, token] for row, token in drawn)
    assert len(drawn) > 4  # several allowed tokens were drawn, not one forced token


def test_a_row_that_allows_nothing_still_returns_a_token(chunked):
    """A grammar dead end: the finite fill keeps the row a number; vLLM's scheduler then rejects the token and
    finishes that request alone."""
    model, hf = chunked.model, chunked.hf
    sequences, firsts = prefilled(model, hf, [5])
    result = model.decode(
        [0], firsts, [len(sequences[0]) - 1], bitmask=torch.zeros(1, bitmask_words(VOCAB), dtype=torch.int32)
    )
    assert 0 <= result.tokens[0] < VOCAB


def test_an_export_without_the_bitmask_input_serves_and_refuses_one(zoo):
    """token_bitmask=False: decode graphs without the bitmask input; two graphs only."""
    old = zoo.artifact("llama", batch_size=1, sequence_length=16, prefill_chunk_size=0, token_bitmask=False)
    model = NeuronModelForCausalLM.from_pretrained(old.path)
    assert model.neuron_config.token_bitmask is False
    sequences, firsts = prefilled(model, old.hf, [5])
    position = [len(sequences[0]) - 1]
    assert model.decode([0], firsts, position).tokens == masked_argmax(
        old.hf, sequences, torch.ones(1, VOCAB, dtype=torch.bool)
    )
    with pytest.raises(InputError, match="has no bitmask input"):
        model.decode([0], firsts, position, bitmask=torch.full((1, bitmask_words(VOCAB)), -1, dtype=torch.int32))
