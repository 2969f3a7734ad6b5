"""The engine configuration for a tp_degree 2 artifact: vLLM runs 2 workers through its multiprocess executor."""

from __future__ import annotations

import argparse

import pytest
from support.engine import serve_config
from support.served import BATCH_SIZE, SEQUENCE_LENGTH


def engine_config(model, usage="LLM_CLASS", **kwargs):
    return serve_config(model, usage, **kwargs)


@pytest.mark.parametrize("tp", [None, 2], ids=["omitted", "explicit"])
def test_the_artifacts_tp_degree_runs_one_worker_per_rank(tp2_dir, tp):
    config = engine_config(tp2_dir, "OPENAI_API_SERVER", **({} if tp is None else {"tensor_parallel_size": tp}))
    parallel = config.parallel_config
    assert (parallel.tensor_parallel_size, parallel.world_size) == (2, 2)
    assert parallel.distributed_executor_backend == "mp"
    assert parallel.worker_cls == "optimum_neuron_plugin.vllm.worker.NeuronWorker"
    # vLLM's defaults scale with the world size: they must still come from the artifact.
    assert config.scheduler_config.max_num_seqs == BATCH_SIZE
    assert config.model_config.max_model_len == SEQUENCE_LENGTH


@pytest.mark.parametrize("tp", [3, 4])
def test_another_tensor_parallel_size_is_refused(tp2_dir, tp):
    """3 does not divide the 4 heads: refused while `vllm serve` parses its arguments, before vLLM's own check
    fails with a traceback (a usage error: argparse.ArgumentError)."""
    with pytest.raises(
        argparse.ArgumentError, match=rf"tensor_parallel_size={tp} does not match the artifact's tp_degree=2"
    ):
        engine_config(tp2_dir, tensor_parallel_size=tp)
