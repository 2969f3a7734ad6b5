"""Plain-HTTP clients for the reliability tests: requests, aborted streams, /metrics, the server's memory.

Everything talks to 127.0.0.1 only, with a timeout on every socket, so no test can hang.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
from vllm_helpers import VENV_BIN, Server, free_port

HOST = "127.0.0.1"
TIMEOUT = 120  # seconds, per socket operation
PR_SET_PDEATHSIG = 1
# Resolved here, not in the forked child (which should run as little as possible before exec).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def die_with_test_process() -> None:
    """Popen preexec_fn: the server gets SIGTERM when the thread that started it ends, so a test
    process killed before its fixtures' teardown (SIGKILL, a CI timeout) leaves no server behind."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def server_env(**extra: str) -> dict[str, str]:
    """The test process's environment without its vLLM / plugin settings, plus the CPU backend.

    One intra-op thread: the tiny model's ops gain nothing from more, and on a shared host OpenMP
    threads waiting for each other make every graph call 10-20x slower (measured: decode 11 ms with
    one thread, 124 ms with two, under a load of 3 on 2 cores).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "ONP_"))}
    # No usage-stats report and no hub lookups: the servers talk to 127.0.0.1 only.
    quiet = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    return {**env, **quiet, "ONP_BACKEND": "cpu", "OMP_NUM_THREADS": "1", **extra}


class ReliabilityServer(Server):
    """vllm_helpers.Server (wait_ready, stop by PID, post, stream) with extra environment variables."""

    def __init__(self, model: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.model = str(model)
        self.port = free_port()
        self.log = log
        command = [str(VENV_BIN / "vllm"), "serve", self.model, "--host", HOST, "--port", str(self.port), *args]
        with log.open("w") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=server_env(**(env or {})),
                start_new_session=True,
                preexec_fn=die_with_test_process,
            )


# ---- requests ---------------------------------------------------------------------------------


def call(port: int, path: str, body: dict | bytes, method: str = "POST") -> tuple[int, dict]:
    """One request; (status, parsed JSON body). A body given as bytes is sent as is (malformed JSON)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
    try:
        connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else {}
    finally:
        connection.close()


def greedy(model: str, prompt: list[int] | str, max_tokens: int, **extra) -> dict:
    """A greedy completion request that returns its token ids and never stops early on EOS."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }


def completion_tokens(port: int, body: dict) -> list[int]:
    status, response = call(port, "/v1/completions", body)
    assert status == 200, response
    return list(response["choices"][0]["token_ids"])


def stream_tokens(port: int, body: dict) -> tuple[int, list[int], list[dict]]:
    """A streamed completion read to the end: (status, token ids, error events)."""
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
    try:
        connection.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}).encode(), headers=_JSON)
        response = connection.getresponse()
        if response.status != 200:
            return response.status, [], [json.loads(response.read())]
        tokens: list[int] = []
        errors: list[dict] = []
        for event in _events(response):
            if "error" in event:
                errors.append(event)
            for choice in event.get("choices", []):
                tokens += choice.get("token_ids") or []
        return response.status, tokens, errors
    finally:
        connection.close()


_JSON = {"Content-Type": "application/json"}


def _events(response: http.client.HTTPResponse):
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def abort(port: int, body: dict, after_events: int = 0, delay: float = 0.0, stream: bool = True) -> int:
    """Send a completion request and disconnect: after `after_events` streamed events, or (0) before any
    response, `delay` seconds after sending. Returns the events read before hanging up."""
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
    read = 0
    try:
        connection.request(
            "POST", "/v1/completions", body=json.dumps({**body, "stream": stream}).encode(), headers=_JSON
        )
        if delay:
            time.sleep(delay)
        if after_events > 0:
            response = connection.getresponse()
            assert response.status == 200, response.read()
            for _ in _events(response):
                read += 1
                if read >= after_events:
                    break
    finally:
        # RST rather than FIN: the server sees the client gone at once.
        with contextlib.suppress(OSError):
            connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        connection.close()
    return read


def concurrently(function: Callable, items: Iterable, workers: int) -> list:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(function, items))


# ---- server state -----------------------------------------------------------------------------


def metrics(port: int) -> dict[str, float]:
    """vLLM's Prometheus gauges and counters, summed over labels (e.g. vllm:num_requests_running)."""
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        with contextlib.suppress(ValueError):
            values[name] = values.get(name, 0.0) + float(value)
    return values


def wait_idle(port: int, timeout: float = 30) -> dict[str, float]:
    """Wait until no request is running or waiting (aborted ones released); fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        values = metrics(port)
        if values.get("vllm:num_requests_running", 0) == 0 and values.get("vllm:num_requests_waiting", 0) == 0:
            return values
        if time.monotonic() > deadline:
            raise AssertionError(f"requests still running/waiting after {timeout} s: {values}")
        time.sleep(0.2)


def health(port: int) -> int:
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status
    finally:
        connection.close()


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (API server + engine core + helpers)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


@dataclass
class RssSampler:
    """Samples tree_rss(pid) every `interval` s in a thread while used as a context manager."""

    pid: int
    interval: float = 0.25
    max_rss: int = 0
    samples: int = 0

    def __enter__(self) -> RssSampler:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._sample()
        self._thread.start()
        return self

    def _sample(self) -> None:
        self.max_rss = max(self.max_rss, tree_rss(self.pid))
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()


# ---- servers that must refuse to start --------------------------------------------------------


@dataclass
class Refusal:
    returncode: int | None
    output: str
    seconds: float
    timed_out: bool


class Refusals:
    """`vllm serve` runs that must exit by themselves, started in the background (`workers` at a time).

    Each case is (model dir, extra args); result(name) waits for that run and returns its exit status
    and output. A run still alive after `timeout` s is killed by PID (its own process group) and
    reported as timed out.
    """

    def __init__(self, cases: dict[str, tuple[Path, list[str]]], logs: Path, workers: int = 2, timeout: float = 300):
        logs.mkdir(parents=True, exist_ok=True)
        self.logs, self.timeout = logs, timeout
        self._processes: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._futures = {name: self._pool.submit(self._run, name, *case) for name, case in cases.items()}

    def _run(self, name: str, model: Path, args: list[str]) -> Refusal:
        command = [str(VENV_BIN / "vllm"), "serve", str(model), "--host", HOST, "--port", str(free_port()), *args]
        log = self.logs / f"{name}.log"
        began = time.monotonic()
        with log.open("w") as out:
            # Started from a pool thread, which lives until close(): the run outlives no test process.
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=server_env(),
                start_new_session=True,
                preexec_fn=die_with_test_process,
            )
            with self._lock:
                self._processes.append(process)
            timed_out = False
            try:
                process.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(process)  # and any engine process it left behind
        return Refusal(process.returncode, log.read_text(), time.monotonic() - began, timed_out)

    def result(self, name: str) -> Refusal:
        return self._futures[name].result(timeout=self.timeout + 60)

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        with self._lock:
            for process in self._processes:
                if process.poll() is None:
                    _kill_group(process)
        self._pool.shutdown(wait=True)


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
