"""A plain-HTTP client for `vllm serve` on 127.0.0.1: requests, streamed (SSE) requests, aborts, /metrics.

A timeout on every socket operation, so no test can hang on the server.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

HOST = "127.0.0.1"
TIMEOUT = 120  # seconds, per socket operation
_JSON = {"Content-Type": "application/json"}


def call(port: int, path: str, body: dict | bytes, method: str = "POST") -> tuple[int, dict]:
    """One request; (status, parsed JSON body). A body given as bytes is sent as is (malformed JSON)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
    try:
        connection.request(method, path, body=data, headers=_JSON)
        response = connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else {}
    finally:
        connection.close()


def text_call(port: int, path: str, body: dict) -> tuple[int, str]:
    """One request whose answer may be plain text (vLLM's /v1/load_lora_adapter on success): (status, body text)."""
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
    try:
        connection.request("POST", path, body=json.dumps(body).encode(), headers=_JSON)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def events(response: http.client.HTTPResponse) -> Iterator[dict]:
    """The JSON events of a server-sent-event response, up to `data: [DONE]`."""
    for raw in response:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            return
        if line.startswith("data: "):
            yield json.loads(line[len("data: ") :])


def stream(
    port: int, path: str, body: dict, on_event: Callable[[dict], None] | None = None
) -> tuple[int, str, list[dict]]:
    """A streamed request read to the end: (status, Content-Type, events); a refused one: its JSON body as the event.
    `on_event` sees each event as it arrives."""
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
    try:
        connection.request("POST", path, body=json.dumps({**body, "stream": True}).encode(), headers=_JSON)
        response = connection.getresponse()
        content_type = response.getheader("Content-Type", "")
        if response.status != 200:
            return response.status, content_type, [json.loads(response.read())]
        received = []
        for event in events(response):
            received.append(event)
            if on_event:
                on_event(event)
        return response.status, content_type, received
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


def stream_tokens(
    port: int, body: dict, on_event: Callable[[dict], None] | None = None
) -> tuple[int, list[int], list[dict]]:
    """A streamed completion read to the end: (status, token ids, error events)."""
    status, _, received = stream(port, "/v1/completions", body, on_event)
    if status != 200:
        return status, [], received
    tokens = [t for event in received for choice in event.get("choices", []) for t in choice.get("token_ids") or []]
    return status, tokens, [event for event in received if "error" in event]


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
            for _ in events(response):
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


def health(port: int) -> int:
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status
    finally:
        connection.close()


def metrics_text(port: int) -> str:
    """vLLM's /metrics page (Prometheus text format)."""
    connection = http.client.HTTPConnection(HOST, port, timeout=TIMEOUT)
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def metrics(port: int) -> dict[str, float]:
    """vLLM's Prometheus gauges and counters, summed over labels (e.g. vllm:num_requests_running)."""
    values: dict[str, float] = {}
    for line in metrics_text(port).splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        with contextlib.suppress(ValueError):
            values[name] = values.get(name, 0.0) + float(value)
    return values


def wait_idle(port: int, timeout: float = 120) -> dict[str, float]:
    """Wait until no request is running or waiting (aborted ones released); fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        values = metrics(port)
        if values.get("vllm:num_requests_running", 0) == 0 and values.get("vllm:num_requests_waiting", 0) == 0:
            return values
        if time.monotonic() > deadline:
            raise AssertionError(f"requests still running/waiting after {timeout} s: {values}")
        time.sleep(0.2)


def requests_finished_by_engine(port: int) -> dict[str, float]:
    """vLLM's vllm:request_success_total, summed per `engine` label (one label per DP engine)."""
    counts: dict[str, float] = {}
    text = metrics_text(port)
    for engine, value in re.findall(r'^vllm:request_success_total\{[^}]*engine="(\d+)"[^}]*\} (\S+)$', text, re.M):
        counts[engine] = counts.get(engine, 0.0) + float(value)
    return counts
