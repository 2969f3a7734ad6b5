"""A device that fails every graph call stops the server, so /health fails and a supervisor can restart it.

The server runs the small-vocabulary model (conftest `small_vocab_dir`): a prompt holding a token id
beyond its embedding table makes the prefill graph raise at run time, a real graph failure. Sending
only such prompts is a device on which every call fails. With ONP_MAX_GRAPH_FAILURES=3, the first two
failures fail their requests (500) while /health stays 200; the third stops the engine: vLLM reports
it dead, /health stops answering 200 and `vllm serve` exits.
"""

from __future__ import annotations

import http.client
import subprocess

import pytest
from support.client import call, greedy, health
from support.server import Server

from .conftest import SERVER_START_TIMEOUT
from .test_faults import bad_prompt

LIMIT = 3
EXIT_TIMEOUT = 120  # seconds for vLLM's watchdog to shut the server down after the engine died


@pytest.fixture(scope="module")
def failing_server(small_vocab_dir, rel_root):
    server = Server(small_vocab_dir, rel_root / "health-server.log", env={"ONP_MAX_GRAPH_FAILURES": str(LIMIT)})
    try:
        server.wait_ready(timeout=SERVER_START_TIMEOUT)
        yield server
    finally:
        server.stop()


def health_or_none(port: int) -> int | None:
    try:
        return health(port)
    except (ConnectionError, OSError, http.client.HTTPException):
        return None


@pytest.mark.slow  # its own live server
def test_consecutive_graph_failures_stop_the_server(failing_server):
    server = failing_server
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
