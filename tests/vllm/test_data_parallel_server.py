"""`vllm serve --data-parallel-size 2` on the served tiny Llama: two engines behind vLLM's front end.

vLLM's own data parallelism: two engine processes (EngineCore_DP0/1), each with its own artifact instance,
cache slots and KV cache, and vLLM's internal load balancing (its DP coordinator) between them. Twelve
concurrent greedy requests on engines of batch 4 (so requests queue on both) must each equal the same
request served alone and Hugging Face's greedy tokens; vLLM's per-engine metrics show both engines served.
The server's two threads (OMP_NUM_THREADS=2) are split, one per engine.
"""

from __future__ import annotations

import pytest
from support.client import completion_tokens, concurrently, greedy, requests_finished_by_engine
from support.references import hf_greedy
from support.served import prompt_of
from support.server import serve

pytestmark = pytest.mark.slow  # a live `vllm serve`

NEW_TOKENS = 8
# Three chunks or less, each its own length and words: 12 requests for 2 engines of 4 slots.
PROMPT_LENGTHS = [5, 17, 33, 9, 40, 12, 3, 28, 21, 45, 7, 30]


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [prompt_of(n, tokenizer, offset=i) for i, n in enumerate(PROMPT_LENGTHS)]


@pytest.fixture(scope="module")
def server(chunked_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("dp-server") / "server.log"
    # Spawned engine processes, as a user's `vllm serve` starts them (the other DP tests fork theirs).
    yield from serve(
        chunked_dir, log, "--data-parallel-size", "2", env={"OMP_NUM_THREADS": "2"}, timeout=900, fork=False
    )


def test_concurrent_requests_equal_their_solo_outputs_and_transformers(tiny_hf, prompts, server):
    body = lambda prompt: greedy(server.model, prompt, NEW_TOKENS)  # noqa: E731
    solo = [completion_tokens(server.port, body(p)) for p in prompts]
    together = concurrently(lambda p: completion_tokens(server.port, body(p)), prompts, workers=len(prompts))
    assert together == solo
    assert solo == [hf_greedy(tiny_hf, p, NEW_TOKENS) for p in prompts]


def test_both_engines_served_requests_with_their_share_of_threads(prompts, server):
    concurrently(lambda p: completion_tokens(server.port, greedy(server.model, p, 2)), prompts, workers=len(prompts))
    finished = requests_finished_by_engine(server.port)
    assert set(finished) == {"0", "1"} and min(finished.values()) >= 1, finished
    log = server.log.read_text()
    for engine in (0, 1):
        assert f"engine {engine} of 2: graphs run with 1 intra-op thread(s)" in log
