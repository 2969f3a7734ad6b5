"""SmolLM2-135M-Instruct (real weights, tokenizer and chat template) against Hugging Face greedy generation.

The session's SmolLM2 export (batch 2, sequence_length 256, chunk 32, one context bucket; tests/conftest.py), loaded
with from_pretrained; the reference is transformers' model read from the same GGUF.
"""

from __future__ import annotations

import json

import pytest
import torch
from support.exports import PROMPT, assert_same_greedy, neuron_config
from support.smollm2 import SHAPE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

CHUNK = SHAPE["prefill_chunk_size"]
NEW_TOKENS = 16
QUESTION = "What is the capital of France?"
LONG_QUESTION = (
    "Here are some notes about rivers. The Seine flows through Paris and reaches the English Channel at Le Havre. "
    "The Loire is the longest river in France and runs past many castles. The Rhone starts in a Swiss glacier, "
    "crosses Lake Geneva and ends in the Mediterranean Sea near Marseille. The Garonne flows from the Pyrenees "
    "to Bordeaux. Using these notes, which river flows through Paris, and where does it end?"
)


@pytest.fixture(scope="module")
def loaded(smollm2, smollm2_runtime):
    return smollm2.hf, smollm2.tokenizer, smollm2_runtime


def chat_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def hf_generate_until_eos(hf, ids: list[int]) -> list[int]:
    """HF `generate`, greedy, stopping at EOS like the chat answer does."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=NEW_TOKENS, do_sample=False)  # fmt: skip
    return out[0, len(ids) :].tolist()


def test_chat_and_multi_chunk_prompts_batched_match_hf(loaded):
    hf, tokenizer, model = loaded
    prompts = [chat_ids(tokenizer, QUESTION), chat_ids(tokenizer, LONG_QUESTION)]
    assert len(prompts[1]) > 2 * CHUNK and len(prompts[1]) % CHUNK  # several chunks and a remainder
    width = max(map(len, prompts))
    eos = model.args.eos_token_ids[0]
    # Left-padded batch of two different lengths in one generate call: slots 0 and 1 together.
    ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    for row, ids_ in enumerate(prompts):
        reference = hf_generate_until_eos(hf, ids_)
        new = out[row, width:].tolist()
        assert new[: len(reference)] == reference, (
            f"prompt {row}: {tokenizer.decode(new)!r} vs {tokenizer.decode(reference)!r}"
        )
        assert all(t == eos for t in new[len(reference) :])
    answer = out[0, width:]
    assert tokenizer.decode(answer, skip_special_tokens=True).strip() == "The capital of France is Paris."


def test_multi_chunk_logits_close_to_hf(loaded):
    hf, tokenizer, model = loaded
    ids = chat_ids(tokenizer, LONG_QUESTION)
    logits = model.prefill(1, ids)
    with torch.no_grad():
        reference = hf(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(logits, reference, atol=1e-3, rtol=0)


def test_export_smollm2_gguf_matches_hf(smollm2, smollm2_runtime):
    """The session's SmolLM2 export is the CLI's, from the GGUF (tests/conftest.py): its options recorded, the chat
    template kept, HF's greedy tokens (tests/cli/test_export.py's helpers)."""
    output = smollm2.directory
    assert smollm2.export.returncode == 0, smollm2.export.stderr
    config = neuron_config(output)
    assert config["prefill_chunk_size"] == 32
    assert (config["context_buckets"], config["prefill_buckets"]) == ([256], [0, 256])
    assert config["decode_batch_sizes"] == [2]
    tokenizer_config = json.loads((output / "tokenizer_config.json").read_text())
    assert tokenizer_config.get("chat_template") or (output / "chat_template.jinja").is_file()
    ids = smollm2.tokenizer(PROMPT)["input_ids"]
    eos = {smollm2.hf.config.eos_token_id} - {None}
    assert_same_greedy(smollm2_runtime, smollm2.hf, ids, eos=eos, new_tokens=16)
