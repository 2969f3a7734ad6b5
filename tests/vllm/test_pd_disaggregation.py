"""Prefill/decode disaggregation through the plugin's PromptStorageConnector (shared storage), with real `vllm serve`
processes.

Two kv_producer servers and one kv_consumer server of the same artifact on 127.0.0.1, behind the proxy
(benchmark/tools/pd_proxy.py: the prompt to a prefill server with max_tokens=1, then to the decode server); a single
plain server of the artifact is the reference. 1P1D: one producer; 2P1D: both in turn. prefill0 prefills whole
prompts in one step (serial), prefill1 in chunks over steps (interleaved, the default).

What the decode server did for each request is read from its runner's records (ONP_STATS_FILE, runner/stats.py) and
vLLM's metrics: it loaded the KV of every prompt token but the last (the partial last block included) and fed the
last one as a decode row, so it ran no prefill graph for the request, where the single server ran one per chunk.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.client import call, completion_tokens, concurrently, greedy, health, metrics, wait_idle
from support.served import CHUNK, prompt_of
from support.server import Server, die_with_test_process, free_port, kill_group, server_env

from optimum_neuron_plugin.vllm.prompt_storage import prompt_file

pytestmark = pytest.mark.slow  # live `vllm serve` processes

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "benchmark" / "tools" / "pd_proxy.py"
NEW_TOKENS = 8
SERIAL = ("--additional-config", json.dumps({"prefill_mode": "serial"}))
# 16 chats per run, 2 to 6 chunks long, some of k blocks + 1 tokens (every token but the last is whole blocks).
LENGTHS = [40, 50, 70, 90, 35, 66, 99, 45, 60, 75, 83, 33, 55, 95, 42, 65]


def connector(role: str, storage: Path) -> tuple[str, ...]:
    config = {
        "kv_connector": "PromptStorageConnector",
        "kv_connector_module_path": "optimum_neuron_plugin.vllm.prompt_storage",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    return ("--kv-transfer-config", json.dumps(config))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pd")


@pytest.fixture(scope="module")
def storage(root) -> Path:
    path = root / "kv"
    path.mkdir()
    return path


def stats_env(path: Path) -> dict[str, str]:
    return {"ONP_STATS_FILE": str(path)}


@pytest.fixture(scope="module")
def servers(chunked_dir, root, storage):
    """The two producers, the consumer and the single server, started together (they share the cores' time)."""
    started = {
        "prefill0": Server(chunked_dir, root / "prefill0.log", *connector("kv_producer", storage), *SERIAL),
        "prefill1": Server(chunked_dir, root / "prefill1.log", *connector("kv_producer", storage)),
        "decode": Server(
            chunked_dir,
            root / "decode.log",
            *connector("kv_consumer", storage),
            *SERIAL,
            env=stats_env(root / "decode.jsonl"),
        ),  # fmt: skip
        "single": Server(chunked_dir, root / "single.log", *SERIAL, env=stats_env(root / "single.jsonl")),
    }
    try:
        for server in started.values():
            server.wait_ready(600)
        yield started
    finally:
        for server in started.values():
            server.stop()


@contextlib.contextmanager
def proxy(prefill: list[Server], decode: Server) -> Iterator[int]:
    """The proxy process (its port), ready once it printed its address."""
    port = free_port()
    command = [sys.executable, str(PROXY), "--port", str(port), "--decode", decode.url]
    for server in prefill:
        command += ["--prefill", server.url]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=server_env(), preexec_fn=die_with_test_process
    )
    try:
        assert "proxy on" in process.stdout.readline().decode()
        yield port
    finally:
        process.kill()
        process.wait(timeout=30)


def chats(tokenizer, run: int) -> list[list[int]]:
    """The run's 16 prompts; a first token of the run's own: no prompt shares a block with another run's."""
    return [[1000 + 100 * run + i, *prompt_of(n - 1, tokenizer, offset=i)] for i, n in enumerate(LENGTHS)]


def answers(servers, prompts: list[list[int]], prefill: list[str]) -> tuple[list, list]:
    """The prompts' greedy tokens, sent concurrently through the proxy and to the single server."""
    body = lambda prompt: greedy(servers["decode"].model, prompt, NEW_TOKENS)  # noqa: E731
    with proxy([servers[name] for name in prefill], servers["decode"]) as port:
        split = concurrently(lambda p: completion_tokens(port, body(p)), prompts, workers=len(prompts))
    single = concurrently(lambda p: completion_tokens(servers["single"].port, body(p)), prompts, workers=len(prompts))
    return split, single


def records(server: Server, path: Path) -> dict[int, dict]:
    """The runner's last record of a finished request (runner/stats.py) by prompt length."""
    wait_idle(server.port)
    # The runner records a request when the next step tells it the request finished: one more step.
    completion_tokens(server.port, greedy(server.model, [1, 2, 3], 1))
    return {r["prompt_tokens"]: r for r in map(json.loads, path.read_text().splitlines())}


def decode_work(servers, root: Path, prompts: list[list[int]]) -> list[tuple[int, int]]:
    """The decode server's (cached_tokens, prefill_calls) of each prompt."""
    done = records(servers["decode"], root / "decode.jsonl")
    return [(done[len(p)]["cached_tokens"], done[len(p)]["prefill_calls"]) for p in prompts]


def external_hits(server: Server) -> float:
    return metrics(server.port).get("vllm:external_prefix_cache_hits_total", 0.0)


def test_1p1d_answers_equal_a_single_instance_and_the_decode_side_runs_no_prefill_graph(servers, root, tokenizer):
    prompts, hits_before = chats(tokenizer, run=0), external_hits(servers["decode"])
    split, single = answers(servers, prompts, ["prefill0"])
    assert split == single
    # Every prompt token but the last loaded (cached_tokens), no prefill graph call: the last token was a decode row.
    assert decode_work(servers, root, prompts) == [(len(p) - 1, 0) for p in prompts]
    assert external_hits(servers["decode"]) - hits_before == sum(len(p) - 1 for p in prompts)
    single_calls = {n: r["prefill_calls"] for n, r in records(servers["single"], root / "single.jsonl").items()}
    assert [single_calls[len(p)] for p in prompts] == [-(-len(p) // CHUNK) for p in prompts]


def test_2p1d_answers_equal_a_single_instance_with_both_prefill_servers_used(servers, root, tokenizer):
    finished = lambda name: metrics(servers[name].port).get("vllm:request_success_total", 0.0)  # noqa: E731
    prompts, before = chats(tokenizer, run=1), {name: finished(name) for name in ("prefill0", "prefill1")}
    split, single = answers(servers, prompts, ["prefill0", "prefill1"])
    assert split == single
    assert {name: finished(name) - count for name, count in before.items()} == {"prefill0": 8, "prefill1": 8}
    assert decode_work(servers, root, prompts) == [(len(p) - 1, 0) for p in prompts]


def test_an_unreadable_stored_entry_fails_its_request_alone(servers, storage, tokenizer):
    """The second prompt's stored KV is overwritten with junk after its prefill: the decode server fails that request
    (vLLM's kv_load_failure_policy "fail"), answers the others equal to the single server, and stays up."""
    prompts = chats(tokenizer, run=3)[:4]
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


def test_a_prefill_server_killed_with_requests_in_flight_fails_only_those(servers, tokenizer):
    """Last in the module: it kills prefill1. The requests the proxy sent there wait for an answer (its API process is
    stopped) when it is killed: the proxy answers 502 naming it for those; the others are served by prefill0 and the
    decode server, which stays up and serves them equal to the single server."""
    prefill1 = servers["prefill1"]
    os.kill(prefill1.process.pid, signal.SIGSTOP)  # connections are still accepted (backlog), never answered
    prompts = chats(tokenizer, run=2)[:4]
    body = lambda prompt: greedy(servers["decode"].model, prompt, NEW_TOKENS)  # noqa: E731
    with proxy([servers["prefill0"], prefill1], servers["decode"]) as port, ThreadPoolExecutor(4) as pool:
        sent = []
        for prompt in prompts:  # in turn: prefill0, prefill1, ...
            sent.append(pool.submit(call, port, "/v1/completions", body(prompt)))
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
