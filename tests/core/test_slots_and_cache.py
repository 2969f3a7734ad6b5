"""Slots are independent: different prompts in different slots (their own cache blocks), prefilled and decoded
together, give exactly what each gives alone; a write for one seq_id touches no other slot's blocks; padding writes
nothing new."""

from __future__ import annotations

import torch
from support.references import hf_greedy, hf_last_logits

from optimum_neuron_plugin.models.decoder import decoder_logits
from optimum_neuron_plugin.models.layers import rope_inv_freq

from .helpers import SEQUENCE_LENGTH, blocks_but, prompt, slot_blocks, slot_positions

SENTINEL = 0.5  # a value no real K/V entry takes exactly


def alone(model, seq_id, tokens, steps):
    """Greedy on one slot only: the new tokens and the logits of every step (prefill, then each decode)."""
    logits = [model.prefill(seq_id, tokens)]
    out = [int(logits[0].argmax())]
    for step in range(steps):
        result = model.decode([seq_id], [out[-1]], [len(tokens) + step])
        logits.append(result.logits[0])
        out.append(result.tokens[0])
    return out, logits


class Streams:
    """Sequences sharing the model: each slot's prompt, new tokens and per-step logits."""

    def __init__(self, model):
        self.model, self.prompts, self.tokens, self.logits = model, {}, {}, {}

    def add(self, seq_id, tokens):
        logits = self.model.prefill(seq_id, tokens)
        self.prompts[seq_id], self.tokens[seq_id], self.logits[seq_id] = tokens, [int(logits.argmax())], [logits]

    def step(self, seq_ids):
        positions = [len(self.prompts[s]) + len(self.tokens[s]) - 1 for s in seq_ids]
        result = self.model.decode(seq_ids, [self.tokens[s][-1] for s in seq_ids], positions)
        for row, seq_id in enumerate(seq_ids):
            self.tokens[seq_id].append(result.tokens[row])
            self.logits[seq_id].append(result.logits[row])


def test_slots_together_give_exactly_what_they_give_alone(llama_logits):
    model = llama_logits.model
    prompts = {2: prompt(19, seed=21), 0: prompt(5, seed=22), 1: prompt(12, seed=23)}
    total_steps = {2: 12, 0: 9, 1: 6}
    # Reference: each prompt alone, in slot 0, the other slots left with whatever earlier tests wrote.
    reference = {s: alone(model, 0, p, total_steps[s]) for s, p in prompts.items()}

    # Together, joining mid-stream as in continuous batching, decoded in one call with unsorted seq_ids.
    streams = Streams(model)
    streams.add(2, prompts[2])
    for _ in range(3):
        streams.step([2])
    streams.add(0, prompts[0])
    for _ in range(3):
        streams.step([2, 0])
    streams.add(1, prompts[1])
    for _ in range(6):
        streams.step([1, 2, 0])

    for seq_id, (tokens, logits) in reference.items():
        assert streams.tokens[seq_id] == tokens, f"slot {seq_id}"
        assert len(streams.logits[seq_id]) == len(logits)
        for step, (got, want) in enumerate(zip(streams.logits[seq_id], logits, strict=True)):
            # Bit-exact within a context bucket; a call's bucket follows its longest row, and a longer
            # reduction may round the last bit differently.
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=f"slot {seq_id} step {step}")
        assert tokens == hf_greedy(llama_logits.hf, prompts[seq_id], len(tokens))


def test_prefill_in_two_calls_with_start(llama_logits):
    """A prompt prefilled in two calls (the second at start=10) continues the same sequence."""
    model, hf = llama_logits.model, llama_logits.hf
    tokens = prompt(23, seed=31)
    model.prefill(1, tokens[:10])
    logits = model.prefill(1, tokens[10:], start=10)
    torch.testing.assert_close(logits, model.prefill(2, tokens), atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, hf_last_logits(hf, tokens), atol=1e-3, rtol=0)


def fill_slot(model, seq_id, value):
    """Every block slot seq_id may hold or read (its own, the free ones and the null block) filled with value: all
    but the other slots' blocks."""
    others = [s for s in range(model.neuron_config.batch_size) if s != seq_id]
    blocks = blocks_but(model, *others)
    for cache in model.caches:
        cache[blocks] = value


def test_chunk_write_leaves_other_slots_untouched(llama_logits):
    model = llama_logits.model
    model.prefill(0, prompt(30, seed=41))
    model.prefill(2, prompt(40, seed=42))
    fill_slot(model, 1, SENTINEL)
    others = slot_blocks(model, 0, 2)
    before = [cache[others].clone() for cache in model.caches]

    length = 19  # chunks of 8, 8 and 3 (padded)
    model.prefill(1, prompt(length, seed=43))
    assert not set(slot_blocks(model, 1).tolist()) & set(others.tolist())
    for layer, (old, new) in enumerate(zip(before, model.caches, strict=True)):
        assert torch.equal(new[others], old), f"cache {layer}: another slot changed"
        positions = slot_positions(model, new, 1)
        assert (positions[:length] != SENTINEL).all(), f"cache {layer}: a prompt position was not written"
        assert (positions[length:] == SENTINEL).all(), f"cache {layer}: a position past the prompt was written"


def test_decode_write_leaves_other_slots_untouched(llama_logits):
    """One or two sequences in a batch-3 token_generation call (padded rows repeat row 0)."""
    model = llama_logits.model
    for seq_id, seed in ((0, 51), (1, 52), (2, 53)):
        model.prefill(seq_id, prompt(10, seed=seed))
    for seq_ids in ([1], [2, 0]):
        before = [cache.clone() for cache in model.caches]
        model.decode(seq_ids, [7] * len(seq_ids), [10] * len(seq_ids))
        unheld = blocks_but(model, 0, 1, 2)  # the null block and the free blocks
        for layer, (old, new) in enumerate(zip(before, model.caches, strict=True)):
            for seq_id in range(3):
                changed = slot_positions(model, new, seq_id) != slot_positions(model, old, seq_id)
                changed_positions = changed.flatten(1).any(dim=1).nonzero().flatten().tolist()
                expected = [10] if seq_id in seq_ids else []
                assert changed_positions == expected, f"cache {layer} slot {seq_id} (decoding {seq_ids})"
            assert torch.equal(new[unheld], old[unheld]), f"cache {layer}: a block no slot holds changed"


def test_padded_positions_write_the_last_real_tokens_values(llama_logits):
    """The last chunk of a 19-token prompt has 3 real tokens and 5 copies of the last one. The cache at the last
    real position equals an unpadded run of the same decoder over the 19 tokens, and no later position moves.
    Layer 1 is the sensitive one: its K/V depend on what the padded queries attended in layer 0."""
    model = llama_logits.model
    length = 19
    tokens = prompt(length, seed=61)
    fill_slot(model, 2, SENTINEL)
    logits = model.prefill(2, tokens)

    reference = [torch.zeros_like(cache) for cache in model.caches]
    with torch.no_grad():
        reference_logits = decoder_logits(
            model.args,
            model.params,
            reference,
            rope_inv_freq(model.args),
            torch.tensor([tokens]),
            torch.arange(length)[None],
            model.graph_set.tables.rows([2]),  # slot 2's blocks, as the prefill had them
            SEQUENCE_LENGTH,
        )
    torch.testing.assert_close(logits, reference_logits[0], atol=1e-5, rtol=0)
    for layer, (got, want) in enumerate(zip(model.caches, reference, strict=True)):
        got, want = slot_positions(model, got, 2), slot_positions(model, want, 2)
        torch.testing.assert_close(got[: length - 1], want[: length - 1], atol=1e-5, rtol=0)
        torch.testing.assert_close(got[length - 1], want[length - 1], atol=1e-5, rtol=0, msg=f"cache {layer}")
        assert (got[length:] == SENTINEL).all(), f"cache {layer}: padding wrote past the last real position"
