"""`--data-parallel-size M`: the configuration each engine gets, its placement, and the refusals.

Configurations are built in-process through vLLM's EngineArgs.create_engine_config (as `vllm serve` does);
an engine's view is made with vLLM's own per-engine step (ParallelConfig.reconfigure_for_independent_dp_rank,
what EngineCoreProc.run_engine_core applies to each engine of a dense model). The live server is in
test_data_parallel_server.py.
"""

from __future__ import annotations

import pytest
import torch

from optimum_neuron_plugin.vllm.engine.data_parallel import data_parallel_problems
from optimum_neuron_plugin.vllm.worker import NeuronWorker


def engine_config(model, **kwargs):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    return EngineArgs(model=str(model), **kwargs).create_engine_config(UsageContext.OPENAI_API_SERVER)


def engine_view(config, dp_rank: int):
    """The configuration as engine `dp_rank` of a dense model sees it (vLLM's run_engine_core)."""
    parallel = config.parallel_config
    parallel.data_parallel_rank_local = dp_rank
    parallel.data_parallel_index = dp_rank
    parallel.reconfigure_for_independent_dp_rank()
    return config


def test_data_parallel_engines_are_independent_and_know_their_place(chunked_dir, monkeypatch):
    config = engine_config(chunked_dir, data_parallel_size=2, tensor_parallel_size=1)
    parallel = config.parallel_config
    assert parallel.data_parallel_size == 2 and parallel.world_size == 1
    assert parallel.worker_cls == "optimum_neuron_plugin.vllm.worker.NeuronWorker"
    # Dense: vLLM runs each engine as an independent EngineCoreProc (no DP all-reduce, no dummy batches).
    assert config.model_config.is_moe is False
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the server's threads, split between the engines
    monkeypatch.delenv("ONP_CPU_THREADS", raising=False)
    worker = NeuronWorker(engine_view(config, 1), local_rank=0, rank=0, distributed_init_method="")
    assert config.parallel_config.data_parallel_size == 1  # what vLLM leaves the engine
    threads = torch.get_num_threads()
    try:
        worker.init_device()
        assert (worker.placement().index, worker.placement().count, torch.get_num_threads()) == (1, 2, 2)
        monkeypatch.setenv("ONP_CPU_THREADS", "3")  # per engine, as given
        worker.init_device()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)


def test_an_idle_engines_dummy_step_runs_a_graph_and_changes_no_requests_cache(chunked_dir, tokenizer):
    """vLLM's dummy batch (an idle MoE data-parallel engine's step): a real decode call that writes only the last
    position of the last slot (in a block of its own), where no request's K/V ever is; every other cache byte stays."""
    worker = NeuronWorker(engine_config(chunked_dir), local_rank=0, rank=0, distributed_init_method="")
    worker.load_model()
    try:
        nc = worker.model.neuron_config
        for slot in range(nc.batch_size):  # every slot holds a prompt, the last one too
            worker.model.prefill(seq_id=slot, token_ids=tokenizer("alpha beta gamma delta").input_ids[: 2 + slot])
        before = [c.clone() for c in worker.model.caches]
        worker.execute_dummy_batch()
        block_size = nc.block_size  # the last slot's position S - 1: its block (through the slot's table) and offset
        block = int(worker.model.graph_set.tables.table[nc.batch_size - 1, (nc.sequence_length - 1) // block_size])
        last = (block, (nc.sequence_length - 1) % block_size)
        for old, cache in zip(before, worker.model.caches, strict=True):
            new = cache.clone()
            old[last] = new[last] = 0
            assert torch.equal(old, new)
        assert any(cache[last].abs().sum() > 0 for cache in worker.model.caches)  # the graph ran and wrote there
    finally:
        worker.shutdown()


@pytest.mark.parametrize(
    "kwargs",
    [
        # a head node running 1 of 2 engines (internal load balancing across nodes)
        dict(data_parallel_size=2, data_parallel_size_local=1, data_parallel_address="127.0.0.1"),
        # a node started with --data-parallel-start-rank 2 without --headless: hybrid load balancing
        dict(data_parallel_size=4, data_parallel_size_local=2, data_parallel_start_rank=2),
    ],
)
def test_every_multi_node_mode_places_engines_by_their_node_local_rank(chunked_dir, kwargs, monkeypatch):
    config = engine_config(chunked_dir, tensor_parallel_size=1, **kwargs)
    local = config.parallel_config.data_parallel_size_local
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the node's threads, split between its engines
    monkeypatch.delenv("ONP_CPU_THREADS", raising=False)
    worker = NeuronWorker(engine_view(config, local - 1), local_rank=0, rank=0, distributed_init_method="")
    assert (worker.placement().index, worker.placement().count) == (local - 1, local)


def test_parallelism_the_plugin_cannot_run_is_refused(chunked_dir):
    with pytest.raises(ValueError, match="pipeline parallelism is not supported by the Neuron plugin: omit --pipeline"):
        engine_config(chunked_dir, pipeline_parallel_size=2)
    # vLLM itself refuses the Ray backend without Ray installed and expert parallelism for a dense model: the
    # plugin's own rules, on a configuration that got past vLLM's.
    config = engine_config(chunked_dir, data_parallel_size=2)
    config.parallel_config.data_parallel_backend = "ray"
    config.parallel_config.enable_expert_parallel = True
    problems = data_parallel_problems(config.parallel_config)
    assert [p.split(":")[0] for p in problems] == [
        "expert parallelism is not supported",
        "data_parallel_backend='ray' is not supported",
    ]


def test_external_load_balancing_of_a_dense_model_is_vllms_refusal(chunked_dir):
    with pytest.raises(ValueError, match="Non-MoE models do not support external data parallel mode"):
        engine_config(chunked_dir, data_parallel_size=2, data_parallel_rank=1)
