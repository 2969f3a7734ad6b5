"""Engine options the plugin cannot honour are refused at startup, saying what to change.

The configuration is built in-process through vLLM's own EngineArgs.create_engine_config, which runs
NeuronPlatform.pre_register_and_update and check_and_update_config exactly as `vllm serve` does (a refusal of this
check stopping a real `vllm serve`, exit status and message: tests/reliability/test_faults.py, missing-field).
"""

from __future__ import annotations

import pytest
from support.engine import serve_config
from support.served import BATCH_SIZE, CHUNK, SEQUENCE_LENGTH


def engine_config(model, usage="OPENAI_API_SERVER", **kwargs):
    return serve_config(model, usage, **kwargs)


INTERLEAVED = {"additional_config": {"prefill_mode": "interleaved"}}
# chunked_dir's defaults: the largest power of two dividing its chunk, sequence length and buckets; every row at full
# length plus the null block.
ARTIFACT_BLOCK = CHUNK
ARTIFACT_BLOCKS = BATCH_SIZE * SEQUENCE_LENGTH // ARTIFACT_BLOCK + 1
SERIAL = {"prefill_mode": "serial"}

REFUSED = {
    "speculative": (
        dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}),
        "--speculative-config needs verify graphs: export the model again with --speculative-tokens 2",
    ),
    "lora": (
        dict(enable_lora=True),
        "--enable-lora needs an export with LoRA slots, this one has none: export again with them, e.g. "
        "optimum-cli export neuron",
    ),
    "logits-processors": (
        dict(logits_processors=["vllm.v1.sample.logits_processor.builtin:MinPLogitsProcessor"]),
        "custom logits processors are not supported: remove --logits-processors",
    ),
    "kv-connector-nixl": (
        dict(kv_transfer_config={"kv_connector": "NixlConnector", "kv_role": "kv_both"}, additional_config=SERIAL),
        "KV connector 'NixlConnector' is not supported (the nixl wheel is not installed with the plugin and its Neuron "
        "memory registration is untested): use one of ExampleConnector, OffloadingConnector, PromptStorageConnector, "
        "or remove --kv-transfer-config",
    ),
    "kv-connector-plugin-without-module": (
        dict(kv_transfer_config={"kv_connector": "PromptStorageConnector", "kv_role": "kv_producer"}),
        "KV connector 'PromptStorageConnector' is the plugin's: set kv_connector_module_path to "
        "'optimum_neuron_plugin.vllm.prompt_storage' in --kv-transfer-config",
    ),
    "kv-connector-out-of-tree": (
        dict(
            kv_transfer_config={"kv_connector": "Mine", "kv_role": "kv_both", "kv_connector_module_path": "my.module"},
            additional_config=SERIAL,
        ),
        "KV connector 'Mine' is not supported (it is not one the plugin's runner was tested with)",
    ),
    "kv-connector-interleaved": (
        dict(kv_transfer_config={"kv_connector": "ExampleConnector", "kv_role": "kv_producer"}, **INTERLEAVED),
        "KV connector 'ExampleConnector' saves a prompt's blocks in the step that first schedules it, so the whole "
        "prompt must prefill in that step: set ONP_PREFILL_MODE=serial",
    ),
    "async-scheduling": (dict(async_scheduling=True), "async scheduling is not supported"),
    "chunked-prefill-serial": (
        dict(enable_chunked_prefill=True, additional_config=SERIAL),
        "--enable-chunked-prefill asks vLLM's scheduler to chunk prompts, but the prefill mode is serial (whole prompts "
        "per step, chunked by the runner; set by ONP_PREFILL_MODE): remove it, or set ONP_PREFILL_MODE=interleaved",
    ),
    "chunked-prefill-speculative": (
        dict(
            enable_chunked_prefill=True,
            speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
        ),
        "(whole prompts per step, chunked by the runner; speculative decoding runs in the serial mode): remove it, or "
        "remove --speculative-config",
    ),
    "no-chunked-prefill-interleaved": (
        dict(enable_chunked_prefill=False, **INTERLEAVED),
        "--no-enable-chunked-prefill contradicts ONP_PREFILL_MODE=interleaved",
    ),
    "target-itl-serial": (
        dict(additional_config={"prefill_target_itl_ms": 200, **SERIAL}),
        "ONP_PREFILL_TARGET_ITL_MS size interleaved prefill's steps, but the prefill mode is serial (whole prompts per "
        "step; set by ONP_PREFILL_MODE): set ONP_PREFILL_MODE=interleaved, or unset ONP_PREFILL_TARGET_ITL_MS",
    ),
    "target-itl-speculative": (
        dict(
            speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
            additional_config={"prefill_target_itl_ms": 200},
        ),
        "the prefill mode is serial (whole prompts per step; speculative decoding runs in the serial mode): remove "
        "--speculative-config, or unset ONP_PREFILL_TARGET_ITL_MS",
    ),
    "chunk-budget-without-chunked-prefill": (
        dict(enable_chunked_prefill=False, additional_config={"prefill_chunk_budget": 2}),
        "the prefill mode is serial (whole prompts per step; the default with --no-enable-chunked-prefill): remove "
        "--no-enable-chunked-prefill, or unset ONP_PREFILL_CHUNK_BUDGET",
    ),
    "target-itl-and-chunk-budget": (
        dict(
            additional_config={"prefill_mode": "interleaved", "prefill_target_itl_ms": 200, "prefill_chunk_budget": 2}
        ),
        "set the latency target (ONP_PREFILL_TARGET_ITL_MS / 'prefill_target_itl_ms') or the fixed number of chunk "
        "calls (ONP_PREFILL_CHUNK_BUDGET / 'prefill_chunk_budget'), not both",
    ),
    "batched-tokens-serial": (
        dict(max_num_batched_tokens=64, additional_config=SERIAL),
        f"max_num_batched_tokens=64 cannot hold a full-length prompt (max_model_len={SEQUENCE_LENGTH})",
    ),
    "batched-tokens-interleaved": (
        dict(max_num_batched_tokens=CHUNK + BATCH_SIZE - 1),
        f"max_num_batched_tokens={CHUNK + BATCH_SIZE - 1} cannot hold a prefill chunk ({CHUNK} tokens) next to a decode "
        f"for each of max_num_seqs={BATCH_SIZE} requests in the interleaved prefill mode, which schedules whole "
        f"chunks: pass --max-num-batched-tokens {CHUNK + BATCH_SIZE} or more",
    ),
    "max-num-seqs-256": (
        dict(max_num_seqs=256),
        f"max_num_seqs=256 exceeds the artifact's compiled batch_size={BATCH_SIZE}: pass --max-num-seqs {BATCH_SIZE}",
    ),
    "kv-cache-dtype": (dict(kv_cache_dtype="fp8"), "remove --kv-cache-dtype"),
    "block-size": (
        dict(block_size=2 * ARTIFACT_BLOCK),
        f"block_size={2 * ARTIFACT_BLOCK} does not match the artifact's KV block size {ARTIFACT_BLOCK} (fixed at "
        f"export: the graphs read the cache by blocks of {ARTIFACT_BLOCK} positions): pass --block-size "
        f"{ARTIFACT_BLOCK} or omit it, or export the model again with --block-size {2 * ARTIFACT_BLOCK}",
    ),
    "num-gpu-blocks-override": (
        dict(num_gpu_blocks_override=ARTIFACT_BLOCKS + 1),
        f"num_gpu_blocks_override={ARTIFACT_BLOCKS + 1} exceeds the artifact's KV pool of {ARTIFACT_BLOCKS} blocks "
        f"(the null block included; its graphs are compiled for it): pass --num-gpu-blocks-override {ARTIFACT_BLOCKS} "
        f"or less, or export the model again with --num-blocks {ARTIFACT_BLOCKS + 1}",
    ),
    "kv-cache-memory-bytes": (
        dict(kv_cache_memory_bytes=10**9),
        f"kv_cache_memory_bytes=1000000000 exceeds the artifact's KV pool of {ARTIFACT_BLOCKS} blocks",
    ),
    "kv-events-without-prefix-cache": (
        dict(kv_events_config={"enable_kv_cache_events": True, "publisher": "null"}, enable_prefix_caching=False),
        "--kv-events-config publishes what the prefix cache holds, but it is off (--no-enable-prefix-caching)",
    ),
    "load-format": (
        dict(load_format="dummy"),
        "load_format='dummy' is not supported (the artifact holds its weights, loaded as exported): remove --load-format",
    ),
    "dtype": (dict(dtype="bfloat16"), "dtype=bfloat16 does not match the artifact's compiled dtype float32"),
    "executor": (dict(distributed_executor_backend="mp"), "remove --distributed-executor-backend"),
    "max-logprobs": (
        dict(max_logprobs=21),
        "max_logprobs=21 exceeds the artifact's compiled max_logprobs=20 (its decode graphs sample on device and "
        "return the top 20 logprobs): pass --max-logprobs 20 or less",
    ),
    "logprobs-mode": (
        dict(logprobs_mode="processed_logprobs"),
        "logprobs_mode='processed_logprobs' is not supported (logprobs are the model's raw log-softmax",
    ),
    "max-logprobs-vocabulary": (dict(max_logprobs=-1), "max_logprobs=-1 (the whole vocabulary) exceeds"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_an_option_the_plugin_cannot_honour_is_refused(chunked_dir, monkeypatch, name):
    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    kwargs, message = REFUSED[name]
    with pytest.raises(ValueError) as error:
        engine_config(chunked_dir, **kwargs)
    assert message in str(error.value)


def test_an_interleave_budget_on_an_export_without_chunks_says_to_export_with_them(full_host_dir, monkeypatch):
    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    with pytest.raises(ValueError) as error:
        engine_config(full_host_dir, additional_config={"prefill_target_itl_ms": 200})
    assert (
        "the prefill mode is serial (whole prompts per step; the default for an export without prefill chunks): "
        "export with --prefill-chunk-size, or unset ONP_PREFILL_TARGET_ITL_MS"
    ) in str(error.value)


@pytest.mark.parametrize("usage", ["LLM_CLASS", "OPENAI_API_SERVER"])
def test_max_num_seqs_equal_to_a_vllm_default_is_still_explicit(chunked_dir, usage):
    # 256 is vLLM's offline default on a CPU platform and 128 its server default: set by hand, both are refused.
    for value in (128, 256):
        with pytest.raises(ValueError, match=f"max_num_seqs={value} exceeds"):
            engine_config(chunked_dir, usage, max_num_seqs=value)


def test_vllm_v2_model_runner_is_refused(chunked_dir, monkeypatch):
    import vllm.envs as envs

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    cached = envs._is_envs_cache_enabled()  # an engine started earlier in this process caches vLLM's variables
    envs.disable_envs_cache()
    try:
        with pytest.raises(ValueError, match="unset VLLM_USE_V2_MODEL_RUNNER"):
            engine_config(chunked_dir)
    finally:
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
        if cached:
            envs.enable_envs_cache()


def test_explicit_values_that_fit_are_kept(chunked_dir, monkeypatch):
    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    config = engine_config(
        chunked_dir, max_num_batched_tokens=SEQUENCE_LENGTH, max_model_len=SEQUENCE_LENGTH, enable_chunked_prefill=False
    )
    assert config.scheduler_config.max_num_batched_tokens == SEQUENCE_LENGTH  # not raised to the plugin's default
    assert engine_config(chunked_dir, max_logprobs=5).model_config.max_logprobs == 5
    config = engine_config(chunked_dir, enable_prefix_caching=False, async_scheduling=False, dtype="float32")
    assert config.cache_config.enable_prefix_caching is False
    config = engine_config(chunked_dir, enable_prefix_caching=True, block_size=ARTIFACT_BLOCK)
    assert (config.cache_config.enable_prefix_caching, config.cache_config.block_size) == (True, ARTIFACT_BLOCK)
    config = engine_config(chunked_dir, num_gpu_blocks_override=ARTIFACT_BLOCKS - 8)  # a smaller pool: kept
    assert config.cache_config.num_gpu_blocks_override == ARTIFACT_BLOCKS - 8
    interleaved = engine_config(chunked_dir, enable_chunked_prefill=True, max_num_batched_tokens=40, **INTERLEAVED)
    assert interleaved.scheduler_config.max_num_batched_tokens == 40
    chunk_and_decodes = CHUNK + BATCH_SIZE  # the smallest budget interleaved prefill can schedule a chunk in
    config = engine_config(chunked_dir, max_num_batched_tokens=chunk_and_decodes)
    assert config.scheduler_config.max_num_batched_tokens == chunk_and_decodes


def test_the_refused_options_of_one_command_line_are_reported_at_once(chunked_dir, monkeypatch):
    """`vllm serve --max-num-seqs 5 --max-model-len 256 --async-scheduling`: one error says what to change for each."""
    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    options = dict(max_num_seqs=BATCH_SIZE + 1, max_model_len=2 * SEQUENCE_LENGTH, async_scheduling=True)
    with pytest.raises(ValueError) as error:
        engine_config(chunked_dir, **options)
    for fragment in (
        f"max_num_seqs={BATCH_SIZE + 1} exceeds the artifact's compiled batch_size={BATCH_SIZE}",
        f"pass --max-num-seqs {BATCH_SIZE} or less (or omit it), or export the model again with a larger --batch-size",
        f"max_model_len={2 * SEQUENCE_LENGTH} exceeds the artifact's compiled sequence_length={SEQUENCE_LENGTH}",
        f"pass --max-model-len {SEQUENCE_LENGTH} or less (or omit it)",
        "async scheduling is not supported (the runner keeps each request's tokens between steps)",
        "remove --async-scheduling",
    ):
        assert fragment in str(error.value)


def test_a_kv_connector_on_an_export_without_chunks_says_to_export_with_them(full_host_dir, monkeypatch):
    """A request whose first blocks a connector loaded prefills from the position after them: chunk graphs."""
    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    with pytest.raises(ValueError) as error:
        engine_config(full_host_dir, kv_transfer_config={"kv_connector": "ExampleConnector", "kv_role": "kv_consumer"})
    assert "KV connector 'ExampleConnector' needs prefill chunk graphs" in str(error.value)
    assert "export the model again with --prefill-chunk-size" in str(error.value)
