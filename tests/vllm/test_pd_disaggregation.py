"""Prefill/decode disaggregation's failures, through the plugin's PromptStorageConnector (shared storage), with real
`vllm serve` processes of the tiny model.

Two kv_producer servers and one kv_consumer server of the same artifact on 127.0.0.1, behind the proxy
(benchmark/tools/pd_proxy.py); a single plain server of the artifact is the reference. A stored entry that cannot be
read fails its request alone; a burst of clients at a stalled proxy is served; a prefill server killed with requests
in flight fails only those. prefill0 prefills
whole prompts in one step (serial), prefill1 in chunks over steps (interleaved, the default).

The served path (1P1D and 2P1D, 16 concurrent chats greedy-equal to transformers, no prefill graph on the decode
side) is test_smollm2_pd.py, on SmolLM2.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.client import call, completion_tokens, concurrently, greedy, health
from support.pd import SERIAL, connector, proxy
from support.served import CHUNK, prompt_of
from support.server import Server, kill_group

from optimum_neuron_plugin.vllm.prompt_storage import prompt_file

pytestmark = pytest.mark.slow  # live `vllm serve` processes

NEW_TOKENS = 8
# 4 prompts per test, 3 to 6 chunks long.
LENGTHS = [40, 50, 70, 90]
BURST = 32


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pd")


@pytest.fixture(scope="module")
def storage(root) -> Path:
    path = root / "kv"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def servers(chunked_dir, root, storage):
    """The two producers, the consumer and the single server, started together (they share the cores' time)."""
    started = {
        "prefill0": Server(chunked_dir, root / "prefill0.log", *connector("kv_producer", storage), *SERIAL),
        "prefill1": Server(chunked_dir, root / "prefill1.log", *connector("kv_producer", storage)),
        "decode": Server(chunked_dir, root / "decode.log", *connector("kv_consumer", storage), *SERIAL),
        "single": Server(chunked_dir, root / "single.log", *SERIAL),
    }
    try:
        for server in started.values():
            server.wait_ready(600)
        yield started
    finally:
        for server in started.values():
            server.stop()


def chats(tokenizer, run: int) -> list[list[int]]:
    """The test's 4 prompts; a first token of the test's own: no prompt shares a block with another test's."""
    return [[1000 + 100 * run + i, *prompt_of(n - 1, tokenizer, offset=i)] for i, n in enumerate(LENGTHS)]


def test_an_unreadable_stored_entry_fails_its_request_alone(servers, storage, tokenizer):
    """The second prompt's stored KV is overwritten with junk after its prefill: the decode server fails that request
    (vLLM's kv_load_failure_policy "fail"), answers the others equal to the single server, and stays up."""
    prompts = chats(tokenizer, run=3)
    body = lambda prompt: greedy(servers["decode"].model, prompt, NEW_TOKENS)  # noqa: E731
    for prompt in prompts:
        assert call(servers["prefill0"].port, "/v1/completions", greedy(servers["decode"].model, prompt, 1))[0] == 200
    prompt_file(storage, prompts[1]).write_bytes(b"not a safetensors file")
    answered = concurrently(lambda p: call(servers["decode"].port, "/v1/completions", body(p)), prompts, workers=4)
    assert [status for status, _ in answered] == [200, 500, 200, 200]
    healthy = [prompts[i] for i in (0, 2, 3)]
    single = [completion_tokens(servers["single"].port, body(p)) for p in healthy]
    assert [answered[i][1]["choices"][0]["token_ids"] for i in (0, 2, 3)] == single
    assert f"its stored KV {prompt_file(storage, prompts[1])} cannot be loaded" in servers["decode"].log_tail(200_000)
    assert health(servers["decode"].port) == 200


def test_a_burst_of_clients_at_a_stalled_proxy_is_served(servers, tokenizer):
    """32 clients connect at once while the proxy process is stopped (as when it is short of CPU): the kernel queues
    their connections in the proxy's listen backlog, and once it runs every request is answered (a backlog of 5,
    socketserver's default, had the kernel reset some of them)."""
    prompts = [[1500 + i, *prompt_of(CHUNK - 1, tokenizer, offset=i)] for i in range(BURST)]
    body = lambda prompt: greedy(servers["decode"].model, prompt, 2)  # noqa: E731

    def status(port: int, prompt: list[int]) -> int | str:
        try:
            return call(port, "/v1/completions", body(prompt))[0]
        except OSError as error:  # a connection reset by the proxy's kernel
            return type(error).__name__

    with proxy([servers["prefill0"]], servers["decode"]) as running, ThreadPoolExecutor(BURST) as pool:
        os.kill(running.process.pid, signal.SIGSTOP)
        sent = [pool.submit(status, running.port, prompt) for prompt in prompts]
        time.sleep(3)  # every client has connected (or been refused) while the proxy accepted none
        os.kill(running.process.pid, signal.SIGCONT)
        assert [future.result(timeout=120) for future in sent] == [200] * BURST


def test_a_prefill_server_killed_with_requests_in_flight_fails_only_those(servers, tokenizer):
    """Last in the module: it kills prefill1. The requests the proxy sent there wait for an answer (its API process is
    stopped) when it is killed: the proxy answers 502 naming it for those; the others are served by prefill0 and the
    decode server, which stays up and serves them equal to the single server."""
    prefill1 = servers["prefill1"]
    os.kill(prefill1.process.pid, signal.SIGSTOP)  # connections are still accepted (backlog), never answered
    prompts = chats(tokenizer, run=2)
    body = lambda prompt: greedy(servers["decode"].model, prompt, NEW_TOKENS)  # noqa: E731
    with proxy([servers["prefill0"], prefill1], servers["decode"]) as running, ThreadPoolExecutor(4) as pool:
        sent = []
        for prompt in prompts:  # in turn: prefill0, prefill1, ...
            sent.append(pool.submit(call, running.port, "/v1/completions", body(prompt)))
            time.sleep(0.5)
        for future in sent[::2]:
            future.result(timeout=120)
        assert not any(future.done() for future in sent[1::2])  # in flight at prefill1
        kill_group(prefill1.process)
        answered = [future.result(timeout=120) for future in sent]
    assert [status for status, _ in answered] == [200, 502, 200, 502]
    assert f"prefill server {prefill1.url} failed" in answered[1][1]["error"]["message"]
    single = [completion_tokens(servers["single"].port, body(p)) for p in prompts[::2]]
    assert [answer["choices"][0]["token_ids"] for _, answer in answered[::2]] == single
    assert health(servers["decode"].port) == 200
    assert completion_tokens(servers["decode"].port, body(prompts[1])) == completion_tokens(
        servers["single"].port, body(prompts[1])
    )
