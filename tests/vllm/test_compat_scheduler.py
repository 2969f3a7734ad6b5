"""compat.py's scheduler entries on vLLM's real Scheduler (the tiny artifact's configuration, vLLM's prefix caching
on): vLLM still calls the private hook, with the arguments the public method expects, and honours what it returns;
the prefix-cache lookup and uncaching act on vLLM's KV cache manager."""

from __future__ import annotations

import pytest
from support.engine import block_hasher

from optimum_neuron_plugin.vllm.compat import prefix_cache_hit, scheduler_with_hooks, uncache_blocks_from

PROMPT = list(range(100, 140))  # 40 tokens
SLICE = 8


def recording_scheduler(model):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from optimum_neuron_plugin.artifact import load_neuron_config
    from optimum_neuron_plugin.vllm.engine.kv_spec import layer_names

    class Recording(scheduler_with_hooks()):
        calls: list[tuple] = []
        slice = SLICE

        def prefill_slice_size(self, request, num_computed_tokens, num_new_tokens):
            self.calls.append(("slice", request.request_id, num_computed_tokens, num_new_tokens))
            return min(num_new_tokens, self.slice)

    # prefill_mode serial: vLLM's own scheduling, with its chunked prefill (the tiny artifact has chunks).
    args = EngineArgs(model=str(model), additional_config={"prefill_mode": "serial"}, enable_chunked_prefill=True)
    config = args.create_engine_config(UsageContext.LLM_CLASS)
    cache = config.cache_config
    cache.num_gpu_blocks = load_neuron_config(str(model)).num_blocks
    spec = FullAttentionSpec(block_size=cache.block_size, num_kv_heads=2, head_size=16, dtype=config.model_config.dtype)
    kv_cache_config = KVCacheConfig(
        num_blocks=cache.num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(layer_names(2), spec)]
    )
    return Recording(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=cache.block_size,
        log_stats=True,
    )


def new_request(req_id: str, block_size: int):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=2, ignore_eos=True)
    return Request(req_id, list(PROMPT), params, None, arrival_time=0.0, block_hasher=block_hasher(block_size))


@pytest.fixture
def scheduler(chunked_dir):
    return recording_scheduler(chunked_dir)


def test_admission_asks_the_slice_size(scheduler):
    scheduler.add_request(new_request("a", scheduler.block_size))
    output = scheduler.schedule()
    assert scheduler.calls == [("slice", "a", 0, len(PROMPT))]
    assert output.num_scheduled_tokens == {"a": SLICE}
    # A running request's slice goes through the same hook.
    scheduler.calls.clear()
    scheduler.schedule()
    assert scheduler.calls == [("slice", "a", SLICE, len(PROMPT) - SLICE)]


def test_a_lookup_finds_the_cached_blocks_and_uncaching_drops_them(scheduler):
    block = scheduler.block_size
    scheduler.slice = len(PROMPT)
    scheduler.add_request(new_request("a", block))
    scheduler.schedule()  # vLLM allocates a's blocks and caches its full ones
    other = new_request("b", block)
    assert prefix_cache_hit(scheduler, other) == (len(PROMPT) - 1) // block * block > block
    uncache_blocks_from(scheduler, "a", block + 3)  # from the block holding position block + 3 on
    assert prefix_cache_hit(scheduler, other) == block
