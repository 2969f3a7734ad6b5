"""A token_generation call that raises fails the requests of that decode batch (HTTP 500), in serial and
interleaved prefill mode, and the server keeps serving; graph calls that fail in a row stop it.

The model (support.tiny_models.export_chain_model) has a 1000-row embedding table behind SmolLM2's 49152-id
tokenizer and lm_head: its greedy next token is t + 1, except after TRAP, where it is BAD (an id beyond the
embedding). A request whose prompt ends at TRAP - k samples BAD as its (k+1)-th token, on the device; the
next token_generation call embeds BAD and raises IndexError, a real graph failure with no mock. Every request
decoding in that call fails with it; requests that finished earlier, and every later one, are served.

A device that fails every graph call must stop the server, so /health fails and a supervisor can restart it. A
prompt holding an id beyond the embedding makes the prefill graph raise: sending only such prompts is a device on
which every call fails. The serial server runs with ONP_MAX_GRAPH_FAILURES=3 (a successful call resets the count,
so the decode-fault tests never reach it): the first two failures fail their requests (500) while /health stays
200; the third stops the engine: vLLM reports it dead, /health stops answering 200 and `vllm serve` exits. That
test stops the server: it is the module's last.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import threading

import pytest
from support.client import call, completion_tokens, concurrently, greedy, health, stream_tokens, wait_idle
from support.references import hf_greedy
from support.server import Server
from support.tiny_models import export_chain_model

from .test_faults import bad_prompt

pytestmark = pytest.mark.slow  # a live `vllm serve`

EMBEDDING_ROWS = 1000
TRAP, BAD = 900, 1500
BATCH_SIZE = 4
MODES = ["serial", "interleaved"]
# Two context buckets (9 graphs instead of the default ladder's 19; the tests are not about buckets): the requests
# decode in bucket 16, the long one then in bucket 512.
SEQUENCE_LENGTH = 512
CONTEXT_BUCKETS = (16, SEQUENCE_LENGTH)
# The long one's prompt (3 tokens) and these fit the sequence. Its ~480 decode steps after the short one is done are
# the time the trapped one has to fail beside it: a few ms each on this tiny model, so the window must be wide for a
# loaded host, where the client threads that send the trapped request may wait their turn.
LONG_TOKENS = 500
LIMIT = 3  # the serial server's ONP_MAX_GRAPH_FAILURES
EXIT_TIMEOUT = 120  # seconds for vLLM's watchdog to shut the server down after the engine died


@pytest.fixture(scope="module")
def chain(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("decode-faults")
    config = dict(
        batch_size=BATCH_SIZE, sequence_length=SEQUENCE_LENGTH, prefill_chunk_size=16, on_device_sampling=True
    )
    config.update(context_buckets=CONTEXT_BUCKETS, prefill_buckets=(0, *CONTEXT_BUCKETS))
    artifact, hf = export_chain_model(
        root / "artifact", tokenizer, EMBEDDING_ROWS, TRAP, BAD, positions=SEQUENCE_LENGTH, **config
    )
    return artifact, hf, root


@pytest.fixture(scope="module")
def servers(chain):
    """Both servers of the module, started together (their startups overlap)."""
    artifact, _, root = chain
    limit = {"serial": {"ONP_MAX_GRAPH_FAILURES": str(LIMIT)}, "interleaved": {}}
    started = {
        mode: Server(
            artifact, root / f"{mode}.log", "--additional-config", json.dumps({"prefill_mode": mode}), env=limit[mode]
        )
        for mode in MODES
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


def good_prompt(i: int) -> list[int]:
    return [40 + i, 7, 100 + 50 * i]  # the chain never reaches TRAP in the tokens asked for


def trapped_prompt(steps: int) -> list[int]:
    """Samples BAD as token steps + 1; the token_generation call after it raises."""
    return [3, 4, TRAP - steps]


@pytest.mark.parametrize("mode", MODES)
def test_a_decode_failure_fails_its_batch_and_the_server_keeps_serving(servers, chain, mode):
    server, hf = servers[mode], chain[1]
    long_prompt, short_prompt = good_prompt(0), good_prompt(1)

    long_is_decoding, short_is_done = threading.Event(), threading.Event()

    def run(job):
        kind, prompt, max_tokens = job
        body = greedy(server.model, prompt, max_tokens)
        if kind == "stream":
            return stream_tokens(server.port, body, on_event=lambda _: long_is_decoding.set())
        if kind == "trapped":
            assert long_is_decoding.wait(timeout=120) and short_is_done.wait(timeout=120)
            return call(server.port, "/v1/completions", body)
        try:
            return call(server.port, "/v1/completions", body)
        finally:
            short_is_done.set()

    # A short request that finishes before the failure, a long streamed one decoding beside the trapped one when
    # its token_generation call raises, and the trapped one, sent once the short one is done and the long one
    # streams (the long one then has ~100 decode steps left; the trapped one fails about 10 steps after it is sent).
    jobs = [("short", short_prompt, 2), ("stream", long_prompt, LONG_TOKENS), ("trapped", trapped_prompt(8), 30)]
    (short_status, short), (long_status, long_tokens, long_errors), (status, body) = concurrently(run, jobs, len(jobs))
    assert short_status == 200 and short["choices"][0]["token_ids"] == hf_greedy(hf, short_prompt, 2)
    assert status == 500, body
    assert body["error"]["code"] == 500 and body["error"]["message"] == "Internal server error"
    assert long_status == 200 and long_errors and long_errors[0]["error"]["code"] == 500, long_errors
    assert 0 < len(long_tokens) < LONG_TOKENS and long_tokens == hf_greedy(hf, long_prompt, len(long_tokens))

    log = server.log.read_text()
    # Every token_generation file: the one-row graph and the batch graph of each bucket.
    graph_files = ", ".join(
        f"{server.model}/graphs/token_generation_{rows}{bucket}.pt2"
        for bucket in CONTEXT_BUCKETS
        for rows in ("x1_", "")
    )
    assert f"graph token_generation ({graph_files}) raised IndexError" in log
    assert "the server keeps serving" in log

    # Every slot was freed: a full batch is served, equal to Hugging Face.
    wait_idle(server.port)
    prompts = [good_prompt(i) for i in range(BATCH_SIZE)]
    outputs = concurrently(lambda p: completion_tokens(server.port, greedy(server.model, p, 12)), prompts, BATCH_SIZE)
    assert outputs == [hf_greedy(hf, p, 12) for p in prompts]
    assert server.process.poll() is None and health(server.port) == 200


@pytest.mark.parametrize("mode", MODES)
def test_a_trapped_request_alone_fails_at_its_first_decode(servers, chain, mode):
    server, hf = servers[mode], chain[1]
    status, body = call(server.port, "/v1/completions", greedy(server.model, trapped_prompt(0), 4))
    assert status == 500 and body["error"]["message"] == "Internal server error", body
    # BAD is the first token (host-sampled): a request asking for that token alone is served.
    assert completion_tokens(server.port, greedy(server.model, trapped_prompt(0), 1)) == [BAD]
    assert hf_greedy(hf, trapped_prompt(0), 1) == [BAD]


def health_or_none(port: int) -> int | None:
    try:
        return health(port)
    except (ConnectionError, OSError, http.client.HTTPException):
        return None


def test_consecutive_graph_failures_stop_the_server(servers):
    server = servers["serial"]
    for n in range(LIMIT - 1):
        status, body = call(server.port, "/v1/completions", greedy(server.model, bad_prompt(n), 4))
        assert status == 500, body
        assert health(server.port) == 200
    status, _ = call(server.port, "/v1/completions", greedy(server.model, bad_prompt(LIMIT), 4))
    assert status >= 500
    try:
        server.process.wait(timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"vllm serve still running after the engine stopped:\n{server.log.read_text()[-3000:]}")
    assert health_or_none(server.port) != 200
    log = server.log.read_text()
    assert f"{LIMIT} graph calls failed in a row (the last: chunked_prefill raised IndexError" in log, log[-3000:]
    assert "the Neuron plugin stops the engine" in log
    assert f"ONP_MAX_GRAPH_FAILURES={LIMIT}" in log
