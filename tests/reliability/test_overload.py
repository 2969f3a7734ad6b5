"""Overload: more concurrent requests than batch_size queue and complete; a bounded soak loses nothing.

The soak sends SOAK_REQUESTS requests (prompts of 1 to 100 tokens, 1 to 16 new tokens, a third of
them streamed) from SOAK_CONCURRENCY clients, twice batch_size. Every greedy output must equal the
output of that prompt run alone (computed once per distinct prompt, before the soak), and the
resident memory of the whole server (API process + engine process, sampled every 0.25 s) must
stay below its size after warm-up plus RSS_GROWTH_BOUND.
"""

from __future__ import annotations

import http.client
import random
import threading
import time

import pytest
from support.client import call, completion_tokens, concurrently, greedy, metrics, stream_tokens, wait_idle
from support.served import BATCH_SIZE, SEQUENCE_LENGTH, prompt_of

from .helpers import RssSampler, tree_rss

pytestmark = pytest.mark.slow  # a live `vllm serve`

SOAK_REQUESTS = 300
SOAK_CONCURRENCY = 2 * BATCH_SIZE
SOAK_DISTINCT = 24
SOAK_LENGTHS = [1, 2, 5, 8, 12, 15, 16, 17, 24, 33, 50, 100]  # 1 to 7 chunks
RSS_GROWTH_BOUND = 256 * 2**20  # bytes over the server's resident size before the soak


class GaugeWatcher:
    """Samples vllm:num_requests_running / _waiting every 50 ms while used as a context manager."""

    def __init__(self, port: int) -> None:
        self.port = port

    def __enter__(self):
        self.running = self.waiting = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                values = metrics(self.port)
            except (OSError, http.client.HTTPException):
                continue  # a sample lost to a busy server: the next one counts
            self.running = max(self.running, values.get("vllm:num_requests_running", 0))
            self.waiting = max(self.waiting, values.get("vllm:num_requests_waiting", 0))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_more_concurrent_requests_than_batch_size_queue_and_complete(server, tokenizer, alone):
    clients = 3 * BATCH_SIZE
    prompts = [prompt_of(5 + 3 * i, tokenizer, offset=i) for i in range(clients)]
    new_tokens = 32  # two waves queue for ~64 decode steps: many gauge samples see them
    expected = [alone(p, new_tokens) for p in prompts]
    with GaugeWatcher(server.port) as watcher:
        outputs = concurrently(
            lambda p: completion_tokens(server.port, greedy(server.model, p, new_tokens)), prompts, clients
        )
    assert outputs == expected
    assert watcher.running <= BATCH_SIZE  # never more than the compiled batch at once
    assert watcher.waiting >= 1  # the others queued
    wait_idle(server.port)


def test_soak(server, tokenizer, alone, capsys):
    rng = random.Random(0)
    distinct = []
    for i in range(SOAK_DISTINCT):
        length = SOAK_LENGTHS[i % len(SOAK_LENGTHS)]
        new_tokens = rng.randint(1, min(16, SEQUENCE_LENGTH - length))
        distinct.append((prompt_of(length, tokenizer, offset=i), new_tokens))
    expected = [alone(prompt, new_tokens) for prompt, new_tokens in distinct]
    plan = [(n, rng.randrange(SOAK_DISTINCT), n % 3 == 0) for n in range(SOAK_REQUESTS)]

    def run(job) -> str | None:
        """None when the request got its alone output, else what went wrong."""
        n, which, streamed = job
        prompt, new_tokens = distinct[which]
        body = greedy(server.model, prompt, new_tokens)
        try:
            if streamed:
                status, tokens, errors = stream_tokens(server.port, body)
                if status != 200 or errors:
                    return f"request {n}: status {status}, errors {errors}"
            else:
                tokens = completion_tokens(server.port, body)
        except Exception as error:  # noqa: BLE001 - every failure is counted, none is lost
            return f"request {n}: {type(error).__name__}: {error}"
        return None if tokens == expected[which] else f"request {n} (prompt {which}): {tokens} != {expected[which]}"

    start_rss = tree_rss(server.process.pid)
    began = time.perf_counter()
    with RssSampler(server.process.pid) as rss:
        failures = [f for f in concurrently(run, plan, SOAK_CONCURRENCY) if f is not None]
    seconds = time.perf_counter() - began
    idle = wait_idle(server.port)
    status, _ = call(server.port, "/v1/completions", greedy(server.model, distinct[0][0], 2))
    with capsys.disabled():
        print(
            f"\nsoak: {SOAK_REQUESTS} requests ({SOAK_DISTINCT} distinct prompts, {SOAK_CONCURRENCY} clients, "
            f"batch_size {BATCH_SIZE}) in {seconds:.1f} s, {len(failures)} failures, "
            f"max RSS {rss.max_rss / 2**20:.0f} MiB (start {start_rss / 2**20:.0f} MiB, "
            f"bound start + {RSS_GROWTH_BOUND / 2**20:.0f} MiB, {rss.samples} samples)"
        )
    assert not failures, failures[:5]
    assert idle.get("vllm:num_requests_running", 0) == 0
    assert status == 200
    assert rss.max_rss <= start_rss + RSS_GROWTH_BOUND
