"""SmolLM2-135M-Instruct end to end through vllm.LLM: greedy chat answers equal transformers token for token.

The session's SmolLM2 export (tests/conftest.py) in vllm.LLM.
"""

from __future__ import annotations

import pytest
from support.engine import close_llm, hf_greedy_cached, make_llm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

NEW_TOKENS = 12
QUESTIONS = [
    "What is the capital of France?",
    "The Seine flows through Paris and reaches the English Channel at Le Havre. The Loire is the longest river in "
    "France. The Rhone crosses Lake Geneva and ends near Marseille. Which river flows through Paris?",
    "Name a color.",
]


def test_chat_greedy_equals_transformers(smollm2):
    from vllm import SamplingParams

    hf, tokenizer, exported = smollm2.hf, smollm2.tokenizer, smollm2.directory
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert len(ids[1]) > 64  # several chunks
    llm = make_llm(exported)
    try:
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
    finally:
        close_llm(llm)
    for prompt_ids, output in zip(ids, outputs, strict=True):
        assert list(output.outputs[0].token_ids) == hf_greedy_cached(hf, prompt_ids, NEW_TOKENS)
    assert "Paris" in outputs[0].outputs[0].text
