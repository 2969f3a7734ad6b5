"""prefill_batch: the chunk loops of several prompts side by side, up to prefill_batch_size whole chunks in one call
of the graph of exactly that many rows, successive chunks of one prompt too; same logits and cache bytes as one
chunk at a time, same tokens as HF."""

from __future__ import annotations

import re

import pytest
import torch
from support.references import hf_greedy, hf_last_logits

from optimum_neuron_plugin import NeuronConfig
from optimum_neuron_plugin.config import NeuronConfigError
from optimum_neuron_plugin.errors import InputError

from . import helpers

NEW_TOKENS = 5


@pytest.fixture(scope="module", params=[2, 3], ids=["2-of-3-rows", "every-row"])
def batched(zoo, request) -> helpers.Artifact:
    """Tiny Llama, batch 3, chunk 8, the light ladder (prior buckets 0, 16, 64: chunks at 8 and 16 run a padded and an
    exact prior in bucket 16): prefill batches of up to 2 (rows copied from the cache) and of up to 3 (3 rows: the
    cache in place)."""
    return zoo.artifact("llama", **helpers.CHUNKED_LIGHT, prefill_batch_size=request.param)


def _greedy_after(
    model, prompts: list[list[int]], first: list[torch.Tensor], slots: list[int] | None = None
) -> list[list[int]]:
    """Greedy tokens of each prompt's slot (default: slot i for prompt i), decoded together after their prefill."""
    tokens, positions = [int(row.argmax()) for row in first], [len(p) for p in prompts]
    slots = list(range(len(prompts))) if slots is None else slots
    out = [[t] for t in tokens]
    for _ in range(NEW_TOKENS - 1):
        tokens = model.decode(slots, tokens, positions).tokens
        positions = [p + 1 for p in positions]
        for row, token in zip(out, tokens, strict=True):
            row.append(token)
    return out


def test_prompts_prefilled_together_give_hf_logits_and_tokens(batched):
    model, width = batched.model, batched.model.neuron_config.prefill_batch_size
    prompts = [helpers.prompt(n, seed=n) for n in (21, 5, 13)]  # 3, 1 and 2 chunks of 8
    with helpers.CallLog(model) as log:
        first = model.prefill_batch([(slot, prompt, 0) for slot, prompt in enumerate(prompts)])
    # the six chunks in order of offset (chunk 0 of all three, chunk 1 of two, chunk 2 of one), `width` per call:
    # each call on the graph of exactly its rows, no padding rows
    assert log.rows == ([2, 2, 2] if width == 2 else [3, 3])
    for prompt, logits in zip(prompts, first, strict=True):
        torch.testing.assert_close(logits, hf_last_logits(batched.hf, prompt), rtol=1e-4, atol=1e-4)
    assert _greedy_after(model, prompts, first) == [hf_greedy(batched.hf, p, NEW_TOKENS) for p in prompts]


def test_slices_continuing_prompts_equal_one_prompt_at_a_time(batched, llama_logits):
    """Interleaved mode's case: slices starting at chunk boundaries of prompts already partly in the cache."""
    model, alone = batched.model, llama_logits.model
    prompts = [helpers.prompt(n, seed=100 + n) for n in (30, 19, 11)]
    heads = [8, 16, 0]
    for slot, (prompt, head) in enumerate(zip(prompts, heads, strict=True)):
        if head:
            model.prefill(slot, prompt[:head])
            alone.prefill(slot, prompt[:head])
    together = model.prefill_batch([(s, p[h:], h) for s, (p, h) in enumerate(zip(prompts, heads, strict=True))])
    one_at_a_time = [alone.prefill(s, p[h:], h) for s, (p, h) in enumerate(zip(prompts, heads, strict=True))]
    for a, b in zip(together, one_at_a_time, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert _greedy_after(model, prompts, together) == [hf_greedy(batched.hf, p, NEW_TOKENS) for p in prompts]


def test_a_long_prompts_chunks_share_calls(batched, llama_logits):
    """A prompt of 5 whole chunks and a partial one: its chunks `width` per call, each row attending the rows before
    it in its own call; same logits and cache bytes as one chunk per call, same tokens as HF."""
    model, alone, width = batched.model, llama_logits.model, batched.model.neuron_config.prefill_batch_size
    tokens = helpers.prompt(45, seed=45)
    for m in (model, alone):
        for cache in m.caches:
            cache.fill_(7.0)
    with helpers.CallLog(model) as log:
        logits = model.prefill(2, tokens)
    assert log.rows == ([2, 2, 2] if width == 2 else [3, 3])
    torch.testing.assert_close(logits, alone.prefill(2, tokens), rtol=1e-5, atol=1e-5)
    for together, one in zip(model.caches, alone.caches, strict=True):
        torch.testing.assert_close(helpers.slot_positions(model, together, 2), helpers.slot_positions(alone, one, 2))
    assert _greedy_after(model, [tokens], [logits], slots=[2]) == [hf_greedy(batched.hf, tokens, NEW_TOKENS)]


def test_prefill_batch_refuses_shared_slots(batched):
    with pytest.raises(InputError, match=r"distinct slots, got seq_ids \[1, 1\]"):
        batched.model.prefill_batch([(1, [5, 6], 0), (1, [7], 0)])


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(batch_size=2, prefill_chunk_size=8, prefill_batch_size=3), "at most batch_size (2)"),
        (dict(batch_size=4, prefill_chunk_size=0, prefill_batch_size=2), "1 without chunked prefill"),
        (dict(batch_size=4, prefill_chunk_size=8, prefill_batch_size=0), "an integer >= 1"),
    ],
)
def test_bad_prefill_batch_sizes_are_refused(config, message):
    with pytest.raises(NeuronConfigError, match="prefill_batch_size=.*" + re.escape(message)):
        NeuronConfig(sequence_length=64, **config)
