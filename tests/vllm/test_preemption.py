"""A KV pool smaller than the running requests' contexts (--num-gpu-blocks-override below the artifact's pool, or an
export whose pool holds fewer full-length sequences than its rows): vLLM preempts requests when blocks run out; they
are prefilled again (from their own blocks still in vLLM's prefix cache, when it is on) and lose or repeat no
token."""

from __future__ import annotations

import json

import pytest
from support.engine import close_llm, make_llm
from support.references import hf_greedy
from support.served import CHUNK, SEQUENCE_LENGTH, prompt_of
from support.tiny_models import export

from optimum_neuron_plugin.artifact import load_neuron_config

pytestmark = pytest.mark.slow  # an in-process vLLM engine

NEW_TOKENS = 40
PROMPT = 50


@pytest.fixture(scope="module")
def stats_file(vllm_root):
    return vllm_root / "preemption-stats.jsonl"


@pytest.fixture(scope="module", params=[False, True], ids=["prefix-caching-off", "prefix-caching-on"])
def prefix_caching(request) -> bool:
    return request.param


@pytest.fixture(scope="module")
def llm(chunked_dir, stats_file, prefix_caching):
    stats_file.unlink(missing_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONP_STATS_FILE", str(stats_file))
        # Four 50-token prompts and half their 40 new tokens fit in the pool; their whole contexts do not.
        block = load_neuron_config(str(chunked_dir)).block_size
        engine = make_llm(
            chunked_dir,
            num_gpu_blocks_override=1 + 4 * -(-(PROMPT + NEW_TOKENS // 2) // block),
            enable_prefix_caching=prefix_caching,
            disable_log_stats=False,
        )
        yield engine
        close_llm(engine)


def test_preempted_requests_resume_exactly(llm, tokenizer, tiny_hf, stats_file, prefix_caching):
    from vllm import SamplingParams

    prompts = [prompt_of(PROMPT, tokenizer, offset=i) for i in range(4)]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert list(output.outputs[0].token_ids) == hf_greedy(tiny_hf, prompt, NEW_TOKENS)
    preemptions = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    assert preemptions > 0, "no request was preempted"
    if not prefix_caching:
        records = [json.loads(line) for line in stats_file.read_text().splitlines()]
        assert any(r["prefill_steps"] > 1 for r in records), "no preempted request was prefilled again"


ROWS = 8  # rows per graph call: twice chunked_dir's, in a pool of less than half their full-length contexts


@pytest.fixture(scope="module")
def many_rows_dir(vllm_root, tiny_hf_dir):
    """More rows than the pool holds full-length sequences: the pool is decided at export (--num-blocks), and vLLM's
    KV cache manager serves from it as it is, preempting when it runs out."""
    block = CHUNK
    return export(
        tiny_hf_dir, vllm_root / "many-rows", batch_size=ROWS, sequence_length=SEQUENCE_LENGTH,
        prefill_chunk_size=CHUNK, on_device_sampling=True, block_size=block,
        num_blocks=1 + ROWS * -(-(PROMPT + NEW_TOKENS // 2) // block), context_buckets=(SEQUENCE_LENGTH,),
        prefill_buckets=(0, SEQUENCE_LENGTH),
    )  # fmt: skip


def test_more_rows_than_the_compiled_pool_holds_serve_every_request(many_rows_dir, tokenizer, tiny_hf):
    from vllm import SamplingParams

    llm = make_llm(many_rows_dir, disable_log_stats=False)
    try:
        prompts = [prompt_of(PROMPT, tokenizer, offset=i)[::-1] for i in range(ROWS)]
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        preemptions = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
        pool = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    finally:
        close_llm(llm)
    assert pool == load_neuron_config(str(many_rows_dir)).num_blocks  # the compiled pool, whole
    assert [list(o.outputs[0].token_ids) for o in outputs] == [hf_greedy(tiny_hf, p, NEW_TOKENS) for p in prompts]
    assert preemptions > 0, "no request was preempted"
