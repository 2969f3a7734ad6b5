"""Data parallelism of a tiny Qwen3-MoE export: vLLM runs MoE engines in lock step (DPEngineCoreProc: a DP process
group, an all-reduce of unfinished requests, a dummy batch on an idle engine).

Two "nodes" with external load balancing (`--data-parallel-size 2 --data-parallel-rank k`, one server per engine, the
engines in lock step across the servers). Requests sent one at a time, to each rank in turn, keep one engine idle
while the other works, so the idle one runs the worker's dummy step (a real decode call; that it writes no request's
K/V is checked on the runtime in test_data_parallel_config.py). Greedy outputs equal Hugging Face's, one engine idle
and both busy; each engine publishes its KV-cache events on the endpoint's port plus its rank. (vLLM's internal load
balancing over two engines of one server: tests/vllm/test_data_parallel_server.py, a dense model.)
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from support.client import completion_tokens, concurrently, greedy
from support.kv_events import Subscriber, stored, vllm_block_hashes
from support.references import hf_greedy
from support.served import CHUNK, SEQUENCE_LENGTH, SHAPE, prompt_of
from support.server import Server, free_port
from support.smollm2 import smollm2_tokenizer
from support.tiny_models import export, save_tiny

pytestmark = pytest.mark.slow  # a live `vllm serve`

NEW_TOKENS = 6
PROMPT_LENGTHS = [7, 20, 35, 11, 26, 4]


@pytest.fixture(scope="module")
def moe_hf_dir(vllm_root):
    return save_tiny(vllm_root / "tiny-moe-hf", "qwen3_moe", tokenizer=smollm2_tokenizer(), max_position_embeddings=256)


@pytest.fixture(scope="module")
def moe_hf(moe_hf_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(moe_hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def moe_dir(moe_hf_dir, vllm_root):
    """One context bucket (6 graphs instead of the default ladder's 23: the test is not about buckets)."""
    return export(
        moe_hf_dir, vllm_root / "moe", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True,
        context_buckets=(SEQUENCE_LENGTH,), prefill_buckets=(0, SEQUENCE_LENGTH),
    )  # fmt: skip


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [prompt_of(n, tokenizer, offset=i) for i, n in enumerate(PROMPT_LENGTHS)]


@pytest.fixture(scope="module")
def external_lb(moe_dir, tmp_path_factory):
    logs, rpc, events = tmp_path_factory.mktemp("dp-moe-external"), free_port(), free_port()
    kv = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events}"})
    common = ("--data-parallel-size", "2", "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port",
              str(rpc), "--kv-events-config", kv, "--block-size", "16")  # fmt: skip
    ranks = [Server(moe_dir, logs / f"rank{k}.log", *common, "--data-parallel-rank", str(k)) for k in (0, 1)]
    try:
        for server in ranks:
            server.wait_ready(900)
        yield ranks, events
    finally:
        for server in reversed(ranks):
            server.stop()


def test_ranks_in_lock_step_equal_transformers_idle_and_busy_and_publish_on_their_ports(external_lb, moe_hf, prompts):
    ranks, events_port = external_lb
    subscriber = Subscriber(events_port + 1)  # rank 1's events
    time.sleep(1)  # a SUB socket misses what is published before its subscription reaches the publisher
    expected = [hf_greedy(moe_hf, p, NEW_TOKENS) for p in prompts]
    ask = lambda job: completion_tokens(job[0].port, greedy(job[0].model, job[1], NEW_TOKENS))  # noqa: E731
    jobs = [(ranks[(i + 1) % 2], prompt) for i, prompt in enumerate(prompts)]  # rank 1 first
    assert [ask(job) for job in jobs] == expected  # one at a time: the other rank idles
    for server in ranks:
        assert "idle data-parallel engine: dummy decode steps" in server.log.read_text()
    assert concurrently(ask, jobs, workers=len(jobs)) == expected  # both busy
    served = vllm_block_hashes(prompts[2])  # sent to rank 1
    assert len(served) == 2
    subscriber.until(lambda events: set(served) <= set(stored(events)))
