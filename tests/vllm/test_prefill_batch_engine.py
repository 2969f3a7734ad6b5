"""vLLM on an artifact exported with prefill_batch_size: prompts scheduled in the same step are prefilled together
(runtime.prefill_batch), in both prefill modes, and generate exactly what transformers does."""

from __future__ import annotations

import json

import pytest
from support.engine import close_llm, make_llm
from support.references import assert_prompt_logprobs_are_hf, hf_greedy
from support.served import BATCH_SIZE, CHUNK, SHAPE, prompt_of
from support.tiny_models import export_chain_model

pytestmark = pytest.mark.slow  # an in-process vLLM engine

NEW_TOKENS = 6
# More prompts than slots; below one chunk, several chunks, a rest.
LENGTHS = [3 * CHUNK + 5, 7, 2 * CHUNK, CHUNK + 1, 40, 2]


# The quick loop (-m "not slow") runs the serial mode; interleaved batches the same prompts through the scheduler;
# "narrow": interleaved under a latency target below any chunk call, which cuts prompts into tail-graph pieces.
MODES = ["serial", pytest.param("interleaved", marks=pytest.mark.slow), pytest.param("narrow", marks=pytest.mark.slow)]


@pytest.mark.parametrize("mode", MODES)
def test_prompts_prefilled_together_equal_transformers(batched_dir, tokenizer, tiny_hf, vllm_root, mode):
    from vllm import SamplingParams

    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate(LENGTHS)]
    stats = vllm_root / f"prefill-batch-{mode}.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONP_STATS_FILE", str(stats))
        # Interleaved: a fixed 2 chunk calls per step. Under the latency target the step time estimate counts each
        # prompt's chunk as a call of its own (vllm/scheduler/step_budget.py), so whether two prompts share a step would depend on
        # the graphs' measured times.
        extra = {"serial": {}, "interleaved": {"prefill_chunk_budget": 2}, "narrow": {"prefill_target_itl_ms": 0.001}}
        prefill_mode = "serial" if mode == "serial" else "interleaved"
        llm = make_llm(batched_dir, additional_config={"prefill_mode": prefill_mode, **extra[mode]})
        try:
            params = [
                SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, prompt_logprobs=logprobs)
                for logprobs in [2] + [None] * (len(prompts) - 1)
            ]  # the first prompt asks for prompt logprobs: it is prefilled alone, on the prompt_logits graphs
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        finally:
            close_llm(llm)
    assert [list(o.outputs[0].token_ids) for o in outputs] == [hf_greedy(tiny_hf, p, NEW_TOKENS) for p in prompts]
    assert_prompt_logprobs_are_hf(outputs[0], prompts[0], 2, tiny_hf)
    records = [json.loads(line) for line in stats.read_text().splitlines()]
    assert len(records) == len(prompts)
    if mode == "narrow":  # once the runner's latencies arrive, a step prefills one tail piece of CHUNK // 2 tokens
        longest = max(records, key=lambda r: r["prompt_tokens"])
        assert longest["prefill_steps"] >= longest["prompt_tokens"] // (CHUNK // 2) - 1, longest
        return
    # The first BATCH_SIZE prompts arrive together and are prefilled together.
    assert sum(r["batched"] for r in records) >= 2, records


def test_a_failing_batched_prefill_fails_only_the_bad_prompt(vllm_root, tokenizer):
    """A prompt holding an id beyond the embedding table makes the batched call raise (IndexError): its slices run
    one at a time, the bad prompt fails alone, the others are served as transformers serves them."""
    from vllm import SamplingParams

    # One context bucket (11 graphs instead of the default ladder's 40): the prompts and their tokens fit in one chunk.
    config = dict(SHAPE, prefill_chunk_size=CHUNK, prefill_batch_size=BATCH_SIZE)
    config.update(context_buckets=(SHAPE["sequence_length"],), prefill_buckets=(0, SHAPE["sequence_length"]))
    artifact, hf = export_chain_model(vllm_root / "prefill-batch-chain", tokenizer, 1000, 900, 1500, **config)
    good = [[40 + i, 7, 100 + 50 * i] for i in range(BATCH_SIZE - 1)]
    bad = [5, 6, 1000 + 4000, 8]
    llm = make_llm(artifact)
    try:
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in [*good, bad]], params, use_tqdm=False)
    finally:
        close_llm(llm)
    for prompt, output in zip(good, outputs, strict=False):
        assert list(output.outputs[0].token_ids) == hf_greedy(hf, prompt, NEW_TOKENS)
    assert outputs[-1].outputs[0].finish_reason == "error", outputs[-1]
