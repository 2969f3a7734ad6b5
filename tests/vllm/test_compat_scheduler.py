"""compat.py's scheduler hooks on vLLM's real Scheduler (the tiny artifact's configuration): vLLM still calls each
private hook, with the arguments the public methods expect, and honours what they return."""

from __future__ import annotations

import pytest

from optimum_neuron_plugin.vllm.compat import scheduler_with_hooks

PROMPT = list(range(100, 140))  # 40 tokens
HIT = 16
SLICE = 8


def recording_scheduler(model):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from optimum_neuron_plugin.vllm.engine.kv_spec import layer_names

    class Recording(scheduler_with_hooks()):
        calls: list[tuple] = []

        def prefill_slice_size(self, request, num_computed_tokens, num_new_tokens):
            self.calls.append(("slice", request.request_id, num_computed_tokens, num_new_tokens))
            return min(num_new_tokens, SLICE)

        def local_prefix_hit(self, request):
            self.calls.append(("hit", request.request_id))
            return HIT

        def request_freed(self, request):
            self.calls.append(("freed", request.request_id))

        def request_preempted(self, request):
            self.calls.append(("preempted", request.request_id))

    # prefill_mode serial: vLLM's own scheduling, with its chunked prefill (the tiny artifact has chunks).
    args = EngineArgs(model=str(model), additional_config={"prefill_mode": "serial"}, enable_chunked_prefill=True)
    config = args.create_engine_config(UsageContext.LLM_CLASS)
    cache = config.cache_config
    cache.num_gpu_blocks = cache.num_gpu_blocks_override
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


def new_request(req_id: str):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    return Request(req_id, list(PROMPT), SamplingParams(max_tokens=2, ignore_eos=True), None, arrival_time=0.0)


@pytest.fixture
def scheduler(chunked_dir):
    return recording_scheduler(chunked_dir)


def test_admission_asks_the_hit_and_the_slice_size(scheduler):
    scheduler.add_request(new_request("a"))
    output = scheduler.schedule()
    # The hit first (vLLM starts the request there), then the slice of the tokens after it, capped by the hook.
    assert scheduler.calls == [("hit", "a"), ("slice", "a", HIT, len(PROMPT) - HIT)]
    assert output.num_scheduled_tokens == {"a": SLICE}
    assert output.scheduled_new_reqs[0].num_computed_tokens == HIT
    # A running request's slice goes through the same hook.
    scheduler.calls.clear()
    scheduler.schedule()
    assert scheduler.calls == [("slice", "a", HIT + SLICE, len(PROMPT) - HIT - SLICE)]


def test_freeing_and_preempting_call_their_hooks(scheduler):
    from vllm.v1.request import RequestStatus

    for req_id in ("a", "b"):
        scheduler.add_request(new_request(req_id))
    scheduler.schedule()
    scheduler.calls.clear()
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    assert sorted(scheduler.calls) == [("preempted", "a"), ("preempted", "b")]
    scheduler.calls.clear()
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert scheduler.calls == [("freed", "a")]


def test_record_prefix_hit_counts_in_vllms_metrics(scheduler):
    request = new_request("a")
    scheduler.record_prefix_hit(request, HIT)
    stats = scheduler.kv_cache_manager.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, len(PROMPT), HIT)


def test_take_back_prefix_hit_undoes_the_recorded_hit(scheduler):
    request = new_request("a")
    scheduler.record_prefix_hit(request, HIT)
    scheduler.take_back_prefix_hit(request, HIT)
    stats = scheduler.kv_cache_manager.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, len(PROMPT), 0)
