"""KV-cache events (kv_events.py) from a live `vllm serve --kv-events-config ...`, read the way a prefix-aware router
reads them: a ZMQ subscriber decoding vLLM's own KVEventBatch.

A served prompt's full blocks arrive as BlockStored with the hashes vLLM's kv_cache_utils computes for the same
tokens; a request sharing those blocks hits them (usage.prompt_tokens_details.cached_tokens); once misses have reused
every slot the blocks arrive as BlockRemoved and the same prompt misses.
"""

from __future__ import annotations

import json
import time

import pytest
from support.client import call, greedy
from support.kv_events import BLOCK, Subscriber, removed, stored, vllm_block_hashes
from support.served import BATCH_SIZE, prompt_of
from support.server import free_port, serve

pytestmark = pytest.mark.slow  # a live `vllm serve`


@pytest.fixture(scope="module")
def events_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(chunked_dir, tmp_path_factory, events_port):
    log = tmp_path_factory.mktemp("kv-events") / "server.log"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events_port}"}
    args = ("--kv-events-config", json.dumps(config), "--block-size", str(BLOCK), "--enable-prompt-tokens-details")
    yield from serve(chunked_dir, log, *args)


def cached_tokens(server, prompt: list[int]) -> int:
    status, body = call(server.port, "/v1/completions", greedy(server.model, prompt, 4))
    assert status == 200, body
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_events_announce_the_blocks_a_request_then_hits_and_their_removal(server, events_port, tokenizer):
    subscriber = Subscriber(events_port)
    time.sleep(1)  # a SUB socket misses what is published before its subscription reaches the publisher
    prompt = prompt_of(2 * BLOCK + 8, tokenizer, offset=1)
    assert cached_tokens(server, prompt) == 0
    # The slot holds the prompt and 3 of its 4 outputs (the last one's K/V is never computed): two full blocks.
    expected = vllm_block_hashes(prompt)
    events = subscriber.until(lambda events: set(expected) <= set(stored(events)))
    blocks = stored(events)
    assert [blocks[h].token_ids for h in expected] == [prompt[:BLOCK], prompt[BLOCK : 2 * BLOCK]]
    assert [blocks[h].parent_block_hash for h in expected] == [None, expected[0]]
    assert {blocks[h].block_size for h in expected} == {BLOCK}
    # A router holding these events predicts two blocks for a prompt that shares them: they hit.
    sharing = prompt[: 2 * BLOCK] + prompt_of(8, tokenizer, offset=11)
    assert sharing[2 * BLOCK] != prompt[2 * BLOCK]
    assert cached_tokens(server, sharing) == 2 * BLOCK
    # Misses take the least recently used slots, the one holding those blocks last: then they are gone.
    for i in range(BATCH_SIZE):
        assert cached_tokens(server, prompt_of(BLOCK + 3, tokenizer, offset=3 + i)[::-1]) == 0
    subscriber.until(lambda events: set(expected) <= removed(events))
    assert cached_tokens(server, prompt) == 0
