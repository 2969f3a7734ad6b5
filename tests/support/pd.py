"""Prefill/decode disaggregation on 127.0.0.1 for the tests: PromptStorageConnector's --kv-transfer-config, the proxy
(benchmark/tools/pd_proxy.py) as a process, and what a server's runner recorded per request (ONP_STATS_FILE)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .client import completion_tokens, greedy, metrics, wait_idle
from .server import Server, die_with_test_process, free_port, server_env

PROXY = Path(__file__).resolve().parents[2] / "benchmark" / "tools" / "pd_proxy.py"
SERIAL = ("--additional-config", json.dumps({"prefill_mode": "serial"}))


def connector(role: str, storage: Path) -> tuple[str, ...]:
    """`vllm serve` arguments: PromptStorageConnector in `role` (kv_producer, kv_consumer) over `storage`."""
    config = {
        "kv_connector": "PromptStorageConnector",
        "kv_connector_module_path": "optimum_neuron_plugin.vllm.prompt_storage",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    return ("--kv-transfer-config", json.dumps(config))


def stats_env(path: Path) -> dict[str, str]:
    """A server's environment for its runner to record each finished request in `path` (runner/stats.py)."""
    return {"ONP_STATS_FILE": str(path)}


@dataclass
class Proxy:
    port: int
    process: subprocess.Popen


@contextlib.contextmanager
def proxy(prefill: list[Server], decode: Server) -> Iterator[Proxy]:
    """The proxy process, ready once it printed its address."""
    port = free_port()
    command = [sys.executable, str(PROXY), "--port", str(port), "--decode", decode.url]
    for server in prefill:
        command += ["--prefill", server.url]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=server_env(), preexec_fn=die_with_test_process
    )
    try:
        assert "proxy on" in process.stdout.readline().decode()
        yield Proxy(port, process)
    finally:
        process.kill()
        process.wait(timeout=30)


def records(server: Server, path: Path) -> dict[int, dict]:
    """The runner's last record of a finished request (runner/stats.py) by prompt length."""
    wait_idle(server.port)
    # The runner records a request when the next step tells it the request finished: one more step, of a one-token
    # prompt (no KV for a connector to save or load: vLLM's external hits stay as they are).
    completion_tokens(server.port, greedy(server.model, [1], 1))
    return {r["prompt_tokens"]: r for r in map(json.loads, path.read_text().splitlines())}


def external_hits(server: Server) -> float:
    """vLLM's count of prompt tokens a KV connector provided."""
    return metrics(server.port).get("vllm:external_prefix_cache_hits_total", 0.0)


def finished(server: Server) -> float:
    return metrics(server.port).get("vllm:request_success_total", 0.0)
