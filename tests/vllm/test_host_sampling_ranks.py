"""Under tensor parallelism rank 0's host-sampled tokens are the ones every rank records (host_sampling.HostSampler).

Three gloo ranks each sample a seeded, temperature 0.8 request from logits that favour another token on every
rank (as logits that differ in their last bits, or a generator in another state, would make a draw differ): each
rank must return rank 0's token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.tensor_parallel import run_ranks

RANKS = 3
VOCAB = 32


def sample_on_rank(rank: int, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from vllm import SamplingParams
    from vllm.config import VllmConfig

    from optimum_neuron_plugin.vllm.runner.request_state import RequestState
    from optimum_neuron_plugin.vllm.sampling.host_sampling import HostSampler

    sampler = HostSampler(VllmConfig(), None, dist.group.WORLD)
    states = [
        RequestState.create(f"r{i}", [1, 2, 3], SamplingParams(temperature=0.8, seed=7 + i, max_tokens=4))
        for i in range(2)
    ]
    logits = torch.zeros(len(states), VOCAB)
    logits[:, 10 + rank] = 20.0  # this rank's logits favour token 10 + rank
    (out / f"rank{rank}.json").write_text(json.dumps(sampler.sample(logits, states)))


@pytest.mark.slow  # three processes running vLLM's sampler
def test_every_rank_records_rank_0s_host_sampled_tokens(tmp_path):
    # Imported here and forked: the ranks do not import vLLM again (seconds of CPU each).
    import vllm.config  # noqa: F401

    import optimum_neuron_plugin.vllm.runner.request_state  # noqa: F401
    import optimum_neuron_plugin.vllm.sampling.host_sampling  # noqa: F401

    run_ranks(sample_on_rank, RANKS, tmp_path, start_method="fork")
    tokens = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(RANKS)]
    assert tokens == [[10, 10]] * RANKS
