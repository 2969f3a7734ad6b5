"""Too few KV blocks on purpose: vLLM preempts requests; they are prefilled again and lose or repeat no token."""

from __future__ import annotations

import json

import pytest
from support.engine import close_llm, make_llm
from support.references import hf_greedy
from support.served import prompt_of

NEW_TOKENS = 40
PROMPT = 50


@pytest.fixture(scope="module")
def stats_file(vllm_root):
    return vllm_root / "preemption-stats.jsonl"


@pytest.fixture(scope="module")
def llm(chunked_dir, stats_file):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONP_STATS_FILE", str(stats_file))
        # 16 usable blocks of 16 tokens: four 50-token prompts fit, their 40 new tokens do not.
        engine = make_llm(chunked_dir, block_size=16, num_gpu_blocks_override=17)
        yield engine
        close_llm(engine)


def test_preempted_requests_resume_exactly(llm, tokenizer, tiny_hf, stats_file):
    from vllm import SamplingParams

    prompts = [prompt_of(PROMPT, tokenizer, offset=i) for i in range(4)]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert list(output.outputs[0].token_ids) == hf_greedy(tiny_hf, prompt, NEW_TOKENS)
    records = [json.loads(line) for line in stats_file.read_text().splitlines()]
    assert any(r["prefill_steps"] > 1 for r in records), "no request was preempted and prefilled again"
