"""Clients that disconnect free their slot, whenever they leave; after 100 aborts a full batch is served.

A leaked slot would show twice: vLLM would keep the request running or waiting (/metrics), and the
runner's slot pool would run dry when batch_size requests arrive together (the engine would fail).
"""

from __future__ import annotations

import itertools
import json
import time

import pytest
from support.client import abort, completion_tokens, concurrently, greedy, wait_idle
from support.served import BATCH_SIZE, CHUNK, SEQUENCE_LENGTH, prompt_of

pytestmark = pytest.mark.slow  # a live `vllm serve`

ABORTS = 100
LONG = SEQUENCE_LENGTH - 8  # several compiled chunks
NEW_TOKENS = 16
ATTEMPTS = 12  # sends of the long prompt, each dropped at a delay moved by the last one's outcome


def full_batch(server, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
    """batch_size requests at once: their outputs and the wall time."""
    began = time.perf_counter()
    outputs = concurrently(
        lambda p: completion_tokens(server.port, greedy(server.model, p, NEW_TOKENS)), prompts, len(prompts)
    )
    return outputs, time.perf_counter() - began


def test_disconnect_mid_stream_frees_the_slots(server, tokenizer, alone):
    prompts = [prompt_of(10 + 9 * i, tokenizer, offset=i) for i in range(BATCH_SIZE)]
    reads = concurrently(
        lambda p: abort(server.port, greedy(server.model, p, 100), after_events=3), prompts, BATCH_SIZE
    )
    assert reads == [3] * BATCH_SIZE
    wait_idle(server.port)
    outputs, _ = full_batch(server, prompts)
    assert outputs == [alone(p, NEW_TOKENS) for p in prompts]


def test_disconnect_during_the_prefill_of_a_long_prompt(server, tokenizer, alone):
    prompt = prompt_of(LONG, tokenizer, offset=5)
    assert LONG > 4 * CHUNK
    # Gone right after sending, or a few milliseconds later: queued, or inside the prompt's chunk loop.
    for delay in (0.0, 0.005, 0.02, 0.05):
        abort(server.port, greedy(server.model, prompt, 50), after_events=0, delay=delay)
        abort(server.port, greedy(server.model, prompt, 50), after_events=0, delay=delay, stream=False)
    wait_idle(server.port)
    assert completion_tokens(server.port, greedy(server.model, prompt, 8)) == alone(prompt, 8)


def test_after_100_aborted_requests_a_full_batch_is_served(server, tokenizer, alone):
    batch = [prompt_of(n, tokenizer, offset=n) for n in (9, CHUNK, 2 * CHUNK + 5, 70)][:BATCH_SIZE]
    batch += [prompt_of(3 + i, tokenizer) for i in range(BATCH_SIZE - len(batch))]
    expected = [alone(p, NEW_TOKENS) for p in batch]
    before, before_seconds = full_batch(server, batch)
    assert before == expected

    short, medium, long = (prompt_of(n, tokenizer, offset=2) for n in (6, 40, LONG))
    # (prompt, events read before hanging up, delay, streamed): mid-stream, while queued, during the prefill.
    kinds = [
        (short, 1, 0.0, True),
        (medium, 5, 0.0, True),
        (long, 0, 0.0, True),
        (medium, 0, 0.01, False),
        (short, 0, 0.0, False),
        (medium, 2, 0.0, True),
        (short, 0, 0.003, True),
        (long, 1, 0.0, True),
    ]
    plan = list(itertools.islice(itertools.cycle(kinds), ABORTS))
    # More clients than batch_size: some are dropped while they wait for a slot.
    reads = concurrently(
        lambda k: abort(server.port, greedy(server.model, k[0], 40), after_events=k[1], delay=k[2], stream=k[3]),
        plan,
        2 * BATCH_SIZE,
    )
    assert len(reads) == ABORTS
    idle = wait_idle(server.port)

    after, after_seconds = full_batch(server, batch)
    assert after == expected
    print(
        f"\n{ABORTS} aborted requests; full batch of {BATCH_SIZE}: {before_seconds:.2f} s before, "
        f"{after_seconds:.2f} s after; vllm:num_requests_running={idle.get('vllm:num_requests_running')}"
    )


def test_abort_in_the_middle_of_an_interleaved_prefill(interleaved_server, alone_interleaved):
    """Interleaved mode prefills a long prompt one chunk per engine step: a client can leave half way."""
    server = interleaved_server
    long = [100 + (7 * i) % 800 for i in range(LONG)]  # ids the small-vocab model knows

    def fresh(attempt: int) -> list[int]:
        """The long prompt with a first token of its own per send: a prefix-cache hit would skip its prefill."""
        return [900 + attempt, *long[1:]]

    steps_needed = -(-LONG // CHUNK)
    background = [[200 + i, 300 + i, 400 + i] for i in range(BATCH_SIZE - 1)]

    def records() -> list[dict]:
        if not server.stats_file.is_file():
            return []
        return [json.loads(line) for line in server.stats_file.read_text().splitlines()]

    def run_or_drop(job) -> None:
        prompt, new_tokens, drop_after = job
        body = greedy(server.model, prompt, new_tokens)
        if drop_after:
            abort(server.port, body, after_events=0, delay=drop_after)
        else:
            completion_tokens(server.port, body)

    def long_prefill_seconds() -> float:
        """From sending the long prompt, next to the background requests, to its one generated token."""

        def run_or_time(prompt) -> float:
            began = time.perf_counter()
            run_or_drop((prompt, 1, 0.0) if len(prompt) == LONG else (prompt, 40, 0.0))
            return time.perf_counter() - began

        return concurrently(run_or_time, [*background, fresh(0)], BATCH_SIZE)[-1]

    prefill_seconds = long_prefill_seconds()
    wait_idle(server.port)
    # The drop must land between the prompt's first and last prefill steps; the host's speed drifts, so each
    # attempt moves the delay by its outcome: no record or no prefill step (too early), an answer (too late).
    delay, found = 0.3 * prefill_seconds, []
    for attempt in range(1, ATTEMPTS + 1):
        seen = len(records())
        jobs = [(p, 40, 0.0) for p in background] + [(fresh(attempt), 30, delay)]
        concurrently(run_or_drop, jobs, len(jobs))
        wait_idle(server.port)
        mine = [r for r in records()[seen:] if r["prompt_tokens"] == LONG]
        if mine and mine[0]["output_tokens"] == 0 and 0 < mine[0]["prefill_steps"] < steps_needed:
            found = mine
            break
        too_late = bool(mine) and (mine[0]["output_tokens"] > 0 or mine[0]["prefill_steps"] >= steps_needed)
        delay *= 0.6 if too_late else 1.6
    assert found, (
        f"no abort landed inside the prefill in {ATTEMPTS} attempts (its first token took {prefill_seconds:.3f} s)"
    )
    print(
        f"\naborted after {found[0]['prefill_steps']} of {steps_needed} prefill steps (dropped at "
        f"{delay:.3f} s of {prefill_seconds:.3f} s)"
    )

    batch = [long[:50], *background]
    outputs = concurrently(
        lambda p: completion_tokens(server.port, greedy(server.model, p, NEW_TOKENS)), batch, len(batch)
    )
    assert outputs == [alone_interleaved(p, NEW_TOKENS) for p in batch]
