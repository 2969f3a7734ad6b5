"""An FP8 artifact (FP8 weights and KV cache) served by vLLM in-process: `--kv-cache-dtype fp8` is accepted when it
matches the artifact and refused otherwise, and greedy answers are the runtime's own on the same artifact."""

from __future__ import annotations

import pytest
from support.engine import close_llm, make_llm
from support.references import runtime_greedy
from support.served import CHUNK, SEQUENCE_LENGTH, SHAPE
from support.tiny_models import export

PROMPTS = ["The capital of France is", "one two three four five six seven"]


@pytest.fixture(scope="module")
def fp8_dir(vllm_root, tiny_hf_dir):
    """One context bucket (6 graphs instead of the default ladder's 23: the tests are not about buckets)."""
    return export(
        tiny_hf_dir, vllm_root / "fp8", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True,
        quantization="fp8", kv_cache_dtype="fp8", context_buckets=(SEQUENCE_LENGTH,),
        prefill_buckets=(0, SEQUENCE_LENGTH),
    )  # fmt: skip


def engine_config(model, **kwargs):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    return EngineArgs(model=str(model), **kwargs).create_engine_config(UsageContext.OPENAI_API_SERVER)


def test_kv_cache_dtype_fp8_is_accepted_only_for_an_fp8_cache(fp8_dir, chunked_dir):
    assert engine_config(fp8_dir, kv_cache_dtype="fp8").cache_config.cache_dtype == "fp8"
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8_e5m2' does not match the artifact's KV cache"):
        engine_config(fp8_dir, kv_cache_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8' does not match the artifact's KV cache \(float32"):
        engine_config(chunked_dir, kv_cache_dtype="fp8")


def test_an_fp8_artifact_serves_the_runtimes_greedy_tokens(fp8_dir, tokenizer):
    from vllm import SamplingParams

    from optimum_neuron_plugin import NeuronModelForCausalLM

    llm = make_llm(fp8_dir, kv_cache_dtype="fp8")
    try:
        outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    finally:
        close_llm(llm)
    model = NeuronModelForCausalLM.from_pretrained(fp8_dir)
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        ids = tokenizer(prompt)["input_ids"]
        assert list(output.outputs[0].token_ids) == runtime_greedy(model, ids, 8), prompt
