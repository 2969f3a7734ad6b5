"""prefill_mode=interleaved: vLLM's scheduler chunks prompts; decodes keep running while a long prompt prefills."""

from __future__ import annotations

import json

import pytest
from support.engine import close_llm, make_llm
from support.references import hf_greedy
from support.served import CHUNK, prompt_of

pytestmark = pytest.mark.slow  # an in-process vLLM engine

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def stats_file(vllm_root):
    return vllm_root / "interleaved-stats.jsonl"


@pytest.fixture(scope="module")
def llm(prompt_logits_dir, stats_file):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONP_STATS_FILE", str(stats_file))
        # A fixed budget of two chunk calls per step (the counts below assume it): the latency target's budget
        # follows the graph times measured at start-up, which a shared host's load moves.
        config = {"prefill_mode": "interleaved", "prefill_chunk_budget": 2}
        engine = make_llm(prompt_logits_dir, additional_config=config)
        yield engine
        close_llm(engine)


def params(max_tokens: int, **kwargs):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kwargs)


def test_the_scheduler_chunks_prompts(llm):
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    # NeuronScheduler plans the slices (whole chunks, the fixture's 2 chunk calls per step): vLLM's cap stays off.
    assert scheduler.enable_chunked_prefill and scheduler.long_prefill_token_threshold == 0


def test_mixed_workload_equals_transformers(llm, tokenizer, tiny_hf):
    # Long prompts (several chunks) arrive with short ones: more requests than slots, prompts split across steps.
    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate([90, 4, 57, 2 * CHUNK, 9, 110, 1])]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params(NEW_TOKENS), use_tqdm=False)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert list(output.outputs[0].token_ids) == hf_greedy(tiny_hf, prompt, NEW_TOKENS)


def test_running_requests_decode_while_a_long_prompt_prefills(llm, tokenizer, stats_file, tiny_hf):
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    short, long = prompt_of(5, tokenizer), prompt_of(100, tokenizer, offset=7)
    engine.add_request("short", {"prompt_token_ids": short}, params(40, output_kind=RequestOutputKind.DELTA))
    for _ in range(2):
        engine.step()
    engine.add_request("long", {"prompt_token_ids": long}, params(NEW_TOKENS, output_kind=RequestOutputKind.DELTA))
    steps_decoding_during_prefill = 0
    long_tokens: list[int] = []
    while engine.has_unfinished_requests():
        new = {o.request_id: list(o.outputs[0].token_ids) for o in engine.step()}
        if not long_tokens and not new.get("long") and new.get("short"):
            steps_decoding_during_prefill += 1
        long_tokens += new.get("long", [])
    # 100 tokens = 7 chunk calls at 2 per step: the short request got a token in every step before
    # the long prompt's first token.
    assert steps_decoding_during_prefill >= -(-100 // CHUNK) // 2
    assert long_tokens == hf_greedy(tiny_hf, long, NEW_TOKENS)
    records = [json.loads(line) for line in stats_file.read_text().splitlines()]
    long_record = next(r for r in records if r["prompt_tokens"] == 100 and r["prefill_steps"] > 1)
    assert long_record["interleaved"] is True
    assert long_record["prefill_calls"] == -(-100 // CHUNK)


def test_prompt_logprobs_of_interleaved_slices_equal_transformers(llm, tokenizer, tiny_hf):
    """A long prompt asking for prompt logprobs is prefilled in slices over several steps, next to other requests:
    each slice's positions fill their rows, handed to vLLM when the prompt is complete."""
    from support.references import assert_prompt_logprobs_are_hf

    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate([90, 4, 57])]
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [params(4, prompt_logprobs=3), params(4), params(4, prompt_logprobs=1)],
        use_tqdm=False,
    )
    assert_prompt_logprobs_are_hf(outputs[0], prompts[0], 3, tiny_hf)
    assert_prompt_logprobs_are_hf(outputs[2], prompts[2], 1, tiny_hf)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert list(output.outputs[0].token_ids) == hf_greedy(tiny_hf, prompt, 4)
