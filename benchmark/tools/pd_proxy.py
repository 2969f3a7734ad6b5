"""A prefill/decode proxy in front of vLLM servers started with --kv-transfer-config, after vLLM's disaggregated
serving proxy example (examples/online_serving/disaggregated_serving): each completion or chat request goes first to
a prefill server (kv_producer) with max_tokens=1, which computes the prompt's KV and hands it to the connector, then
unchanged to a decode server (kv_consumer), whose connector loads that KV instead of prefilling, and whose answer
(streamed or not) is the client's. Prefill and decode servers are taken in turn (xPyD: several of each).

The prefill answer's kv_transfer_params (NixlConnector: where the blocks are) ride on the decode request, as vLLM's
proxy does; ExampleConnector finds the KV by the prompt's tokens and needs none.

    python benchmark/tools/pd_proxy.py --port 8000 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200

Standard library only: one thread per client connection.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

TIMEOUT = 600  # seconds per socket operation
ROUTED = ("/v1/completions", "/v1/chat/completions")


class Pool:
    """Servers taken in turn."""

    def __init__(self, urls: list[str]) -> None:
        self.urls, self._next, self._lock = urls, itertools.cycle(urls), threading.Lock()

    def take(self) -> str:
        with self._lock:
            return next(self._next)


def connect(url: str) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT)


def prefill_body(body: dict) -> dict:
    """The request as the prefill server gets it: one token, no stream, its KV kept for a remote decode."""
    body = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
    body.pop("stream_options", None)
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    return body


class Proxy(BaseHTTPRequestHandler):
    prefill: Pool
    decode: Pool
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path not in ROUTED:
            return self.forward(self.decode.take(), "POST", body)
        prefill = self.prefill.take()
        try:
            status, answer = self.call(prefill, prefill_body(body))
        except OSError as error:  # a prefill server that is down fails the requests sent to it, nothing else
            return self.reply(502, {"error": {"message": f"prefill server {prefill} failed: {error}", "code": 502}})
        if status != 200:  # the prefill's refusal or failure is the client's answer
            return self.reply(status, answer)
        params = answer.get("kv_transfer_params")
        self.forward(self.decode.take(), "POST", {**body, "kv_transfer_params": params} if params else body)

    def do_GET(self) -> None:
        self.forward(self.decode.take(), "GET", None)

    def call(self, url: str, body: dict) -> tuple[int, dict]:
        connection = connect(url)
        try:
            connection.request("POST", self.path, json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
        finally:
            connection.close()

    def forward(self, url: str, method: str, body: dict | None) -> None:
        """The server's answer streamed through as it arrives (chunked for server-sent events)."""
        connection = connect(url)
        try:
            data = json.dumps(body).encode() if body is not None else None
            connection.request(method, self.path, data, {"Content-Type": "application/json"})
            response = connection.getresponse()
            self.send_response(response.status)
            self.send_header("Content-Type", response.getheader("Content-Type", "application/json"))
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while chunk := response.read1(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:
            connection.close()

    def reply(self, status: int, answer: dict) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:  # one line per request is noise under load
        return


class ProxyServer(ThreadingHTTPServer):
    # socketserver's listen backlog is 5: a burst of clients arriving while the proxy is short of CPU overflows it and
    # the kernel resets some of them (seen with 16 concurrent chats on a loaded 2-core host).
    request_queue_size = 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--prefill", action="append", required=True, help="a kv_producer server's URL (repeat)")
    parser.add_argument("--decode", action="append", required=True, help="a kv_consumer server's URL (repeat)")
    args = parser.parse_args()
    Proxy.prefill, Proxy.decode = Pool(args.prefill), Pool(args.decode)
    server = ProxyServer((args.host, args.port), Proxy)
    print(f"proxy on http://{args.host}:{args.port}: prefill {args.prefill}, decode {args.decode}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
