"""In-process vllm.LLM on a non-chunked artifact that returns logits (host sampling): logprobs, min_tokens, min_p."""

from __future__ import annotations

import pytest
import torch
from support.engine import close_llm, make_llm
from support.references import hf_greedy
from support.served import BATCH_SIZE, prompt_of

pytestmark = pytest.mark.slow  # an in-process vLLM engine

NEW_TOKENS = 6
LENGTHS = [3, 20, 45, 100, 7, 1]


@pytest.fixture(scope="module")
def llm(full_host_dir):
    engine = make_llm(full_host_dir)
    yield engine
    close_llm(engine)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [prompt_of(n, tokenizer, offset=3 * i) for i, n in enumerate(LENGTHS)]


def run(llm, prompts, **kwargs):
    from vllm import SamplingParams

    params = SamplingParams(**{"max_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True, **kwargs})
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]


def test_greedy_equals_transformers(llm, prompts, tiny_hf):
    assert len(prompts) > BATCH_SIZE
    for prompt, out in zip(prompts, run(llm, prompts), strict=True):
        assert list(out.token_ids) == hf_greedy(tiny_hf, prompt, NEW_TOKENS)


def test_logprobs_are_log_softmax_of_the_model_logits(llm, prompts, tiny_hf):
    num = 3
    for prompt, out in zip(prompts[:3], run(llm, prompts[:3], logprobs=num), strict=True):
        tokens = list(out.token_ids)
        assert len(out.logprobs) == len(tokens)
        with torch.no_grad():
            logits = tiny_hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), dim=-1)
        for position, (token, entry) in enumerate(zip(tokens, out.logprobs, strict=True)):
            top = torch.topk(expected[position], num).indices.tolist()
            assert set(entry) == {token, *top}
            assert entry[token].rank == 1  # greedy
            for token_id, logprob in entry.items():
                assert logprob.logprob == pytest.approx(float(expected[position, token_id]), abs=1e-3)


def test_min_tokens_bans_stop_tokens_until_reached(llm, prompts):
    reference = list(run(llm, prompts[:1])[0].token_ids)
    stop = reference[0]
    assert list(run(llm, prompts[:1], stop_token_ids=[stop])[0].token_ids) == [stop]
    tokens = list(run(llm, prompts[:1], stop_token_ids=[stop], min_tokens=3)[0].token_ids)
    assert len(tokens) >= 3 and stop not in tokens[:3]


def test_min_p_one_keeps_only_the_most_likely_token(llm, prompts):
    greedy = [list(o.token_ids) for o in run(llm, prompts)]
    sampled = [list(o.token_ids) for o in run(llm, prompts, temperature=1.0, min_p=1.0, seed=3)]
    assert sampled == greedy


def test_seeded_host_sampling_is_reproducible(llm, prompts):
    first = [list(o.token_ids) for o in run(llm, prompts, temperature=0.9, seed=11)]
    assert [list(o.token_ids) for o in run(llm, prompts, temperature=0.9, seed=11)] == first
