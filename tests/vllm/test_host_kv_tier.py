"""The host-memory KV tier: `vllm serve` with vLLM's OffloadingConnector (its scheduler side unchanged, the plugin's
block copies, runner/host_tier.py) on a pool too small to keep a prompt's blocks while others run.

A prompt, then enough other prompts to evict its blocks from the pool, then the prompt again: its blocks come back
from host memory (vLLM's external prefix-cache hits count them, its local hits do not), the runner computes only the last
prompt token again, and the tokens are the first run's and transformers'.
"""

from __future__ import annotations

import json

import pytest
from support.client import completion_tokens, greedy, metrics, wait_idle
from support.references import hf_greedy
from support.served import CHUNK, prompt_of
from support.server import serve

pytestmark = pytest.mark.slow  # a live `vllm serve`

NEW_TOKENS = 8
POOL_BLOCKS = 12  # the null block and 11 of 16 tokens: two 72-token requests at most
PROMPT = 4 * CHUNK  # 4 whole blocks
HOST_TIER = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"cpu_bytes_to_use": 4_000_000},
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("host-tier")


@pytest.fixture(scope="module")
def server(chunked_dir, root):
    yield from serve(
        chunked_dir, root / "server.log", "--num-gpu-blocks-override", str(POOL_BLOCKS),
        "--kv-transfer-config", json.dumps(HOST_TIER), env={"ONP_STATS_FILE": str(root / "stats.jsonl")},
    )  # fmt: skip


def hits(port: int) -> tuple[float, float]:
    """vLLM's (local, external) prefix-cache hit tokens so far."""
    values = metrics(port)
    return values.get("vllm:prefix_cache_hits_total", 0.0), values.get("vllm:external_prefix_cache_hits_total", 0.0)


def runner_records(server, root) -> list[dict]:
    wait_idle(server.port)
    completion_tokens(server.port, greedy(server.model, [1, 2, 3], 1))  # the next step records the finished ones
    return [json.loads(line) for line in (root / "stats.jsonl").read_text().splitlines()]


def test_a_prompt_evicted_from_the_pool_is_served_from_host_memory(server, root, tokenizer, tiny_hf):
    prompt = [2000, *prompt_of(PROMPT - 1, tokenizer)]
    body = lambda p: greedy(server.model, p, NEW_TOKENS)  # noqa: E731
    first = completion_tokens(server.port, body(prompt))
    for i in range(4):  # 4 x 5 blocks through an 11-block pool: the prompt's blocks are evicted
        completion_tokens(server.port, body([2001 + i, *prompt_of(PROMPT - 1, tokenizer, offset=i + 1)]))
    local, external = hits(server.port)
    again = completion_tokens(server.port, body(prompt))
    assert again == first == hf_greedy(tiny_hf, prompt, NEW_TOKENS)
    local_after, external_after = hits(server.port)
    assert local_after == local  # the pool no longer held any of the prompt's blocks
    assert external_after - external == PROMPT  # all of them came back from host memory
    last = [r for r in runner_records(server, root) if r["prompt_tokens"] == PROMPT][-1]
    # vLLM loads all 4 blocks and computes the last prompt token again (its logits give the first token), which the
    # runner feeds as a decode row: no prefill call.
    assert (last["cached_tokens"], last["prefill_calls"]) == (PROMPT - 1, 0)


def test_the_host_tier_reports_its_stores_and_loads(server):
    values = metrics(server.port)
    assert values.get("vllm:kv_offload_store_bytes_total", 0.0) > 0, sorted(k for k in values if "offload" in k)
    assert values.get("vllm:kv_offload_load_bytes_total", 0.0) > 0
