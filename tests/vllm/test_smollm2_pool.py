"""`vllm serve` of a 32-row block-pool export of SmolLM2 whose pool holds fewer tokens than 32 concurrent chats need.

vLLM's KV cache manager runs out of blocks and preempts (its /metrics count it); every chat still gets transformers'
greedy tokens; with `--kv-events-config` the server announces vLLM's own BlockStored / BlockRemoved hashes, and the
blocks announced and not removed are exactly the ones its prefix cache then hits.
"""

from __future__ import annotations

import json
import time

import pytest
from support.cli import run_export
from support.client import call, concurrently, greedy, metrics, wait_idle
from support.engine import hf_greedy_cached
from support.kv_events import BLOCK, Subscriber, vllm_block_hashes
from support.server import free_port, serve
from support.smollm2 import smollm2_gguf, smollm2_tokenizer

from optimum_neuron_plugin.sources import gguf_read_once

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # a SmolLM2 export and a live server

ROWS = 32
POOL_BLOCKS = 32  # 512 tokens for 32 chats of 68 tokens each (plus the null block)
NEW_TOKENS = 24
QUESTIONS = [f"What is {a} plus {40 - a}? Answer with one number." for a in range(3, 3 + ROWS)]


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("smollm2-pool") / "artifact"
    result = run_export(
        "--model", smollm2_gguf(), "--batch-size", ROWS, "--sequence-length", 256, "--prefill-chunk-size", 32,
        "--context-buckets", "256", "--prefill-buckets", "0,256", "--decode-batch-sizes", ROWS,
        "--block-size", BLOCK, "--num-blocks", POOL_BLOCKS + 1, "--backend", "cpu", directory, timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return directory


@pytest.fixture(scope="module")
def events_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(pool_dir, events_port, tmp_path_factory):
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events_port}"}
    log = tmp_path_factory.mktemp("smollm2-pool-serve") / "serve.log"
    yield from serve(
        pool_dir, log, "--enable-prompt-tokens-details", "--kv-events-config", json.dumps(events),
        "--block-size", str(BLOCK), timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def hf():
    import torch
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf()
    with gguf_read_once():
        return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()


def chat_ids(question: str) -> list[int]:
    tokenizer = smollm2_tokenizer()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def held(events) -> set:
    """The block hashes announced stored and not removed since, in the order the server published them."""
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    blocks: set = set()
    for event in events:
        if isinstance(event, BlockStored):
            blocks |= set(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            blocks -= set(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            blocks.clear()
    return blocks


def predicted_hit(prompt: list[int], blocks: set) -> int:
    """The tokens vLLM's prefix cache serves a prompt from, if it holds exactly `blocks`: the leading full blocks
    found, never the prompt's last token (vLLM computes at least one)."""
    hit = 0
    for block_hash in vllm_block_hashes(prompt[:-1]):
        if block_hash not in blocks:
            break
        hit += BLOCK
    return hit


def completion(server, prompt: list[int]) -> dict:
    status, body = call(server.port, "/v1/completions", greedy(server.model, prompt, NEW_TOKENS))
    assert status == 200, body
    return body


def test_32_chats_over_a_small_pool_are_preempted_and_equal_transformers(server, events_port, hf):
    prompts = [chat_ids(q) for q in QUESTIONS]
    assert sum(len(p) + NEW_TOKENS for p in prompts) > 2 * POOL_BLOCKS * BLOCK  # the contexts overfill the pool
    subscriber = Subscriber(events_port)
    time.sleep(1)  # a SUB socket misses what is published before its subscription reaches the publisher
    bodies = concurrently(lambda prompt: completion(server, prompt), prompts, workers=ROWS)
    outputs = [body["choices"][0]["token_ids"] for body in bodies]
    assert outputs == [hf_greedy_cached(hf, prompt, NEW_TOKENS) for prompt in prompts]
    assert wait_idle(server.port)["vllm:num_preemptions_total"] > 0, "no request was preempted"

    # The blocks the server announced (and did not remove) are exactly those its prefix cache serves: each prompt,
    # sent again, hits the leading blocks the events say are held, no more and no fewer.
    computed = {h for p, o in zip(prompts, outputs, strict=True) for h in vllm_block_hashes(p + o[:-1])}
    assert len(held(subscriber.settled())) > 0 and held(subscriber.received) <= computed
    for prompt in prompts[::8]:
        expected = predicted_hit(prompt, held(subscriber.settled()))
        assert expected > 0
        assert completion(server, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == expected
    assert metrics(server.port)["vllm:prefix_cache_hits_total"] > 0
