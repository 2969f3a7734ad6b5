"""Prefix-aware routing by KV-cache events against round robin: two `vllm serve` replicas, multi-turn conversations.

    .venv/bin/python benchmark/workloads/kv_router.py ARTIFACT --out DIR [--conversations 8 --turns 4 --rounds 2]

Starts two replicas of ARTIFACT on 127.0.0.1 (one CPU thread each, `--kv-events-config` on two ports,
`--enable-prompt-tokens-details`), then runs the same kind of workload through two routers, alternated round after
round (each round its own conversations, so no round hits another's prefixes):
- round robin: replica i % 2 for the i-th request;
- prefix-aware: a small router subscribed to both replicas' KV-cache events (vLLM's KVEventBatch over ZMQ) keeps
  the block hashes each replica holds, hashes the prompt's full blocks as vLLM does (kv_cache_utils, sha256) and
  sends it to the replica holding the longest run of them (ties: fewer requests in flight, then round robin).
A conversation is a closed loop of turns; each turn's prompt is the whole history (token ids: the earlier prompts and
answers) plus a new question. Writes summary.md (TTFT p50 and prefix-cache hit rate per router, ratios) and
turns.json (one record per request) in DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from itertools import count
from pathlib import Path

import aiohttp
import msgspec
import zmq

HOST = "127.0.0.1"
BLOCK = 16


@dataclass
class Turn:
    router: str
    round: int
    conversation: int
    turn: int
    replica: int
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int


class Replica:
    def __init__(self, artifact: Path, index: int, port: int, events_port: int, log: Path) -> None:
        self.index, self.port, self.events_port = index, port, events_port
        kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events_port}"}
        command = [str(Path(sys.executable).parent / "vllm"), "serve", str(artifact), "--host", HOST, "--port",
                   str(port), "--kv-events-config", json.dumps(kv), "--block-size", str(BLOCK),
                   "--enable-prompt-tokens-details"]  # fmt: skip
        env = {**os.environ, "ONP_BACKEND": "cpu", "OMP_NUM_THREADS": "1", "VLLM_NO_USAGE_STATS": "1"}
        self.process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)  # fmt: skip
        self.held: set[int | bytes] = set()
        self.in_flight = 0

    def wait_ready(self, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"replica {self.index} exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self.port}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise SystemExit(f"replica {self.index} not ready after {timeout} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def follow_events(replicas: list[Replica], stop: threading.Event) -> None:
    """Apply every replica's KV-cache events to its `held` set (the router's view)."""
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    poller, sockets = zmq.Poller(), {}
    for replica in replicas:
        socket = zmq.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.connect(f"tcp://{HOST}:{replica.events_port}")
        poller.register(socket, zmq.POLLIN)
        sockets[socket] = replica
    while not stop.is_set():
        for socket, _ in poller.poll(200):
            replica = sockets[socket]
            _topic, _seq, payload = socket.recv_multipart()
            for event in decoder.decode(payload).events:
                if isinstance(event, BlockStored):
                    replica.held.update(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    replica.held.difference_update(event.block_hashes)
                elif isinstance(event, AllBlocksCleared):
                    replica.held.clear()


def block_hashes(tokens: list[int]) -> list[int | bytes]:
    """vLLM's hashes of the full blocks, as its events carry them (maybe_convert_block_hash)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import hash_block_tokens, maybe_convert_block_hash

    hashes, parent = [], None
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        parent = hash_block_tokens(sha256, parent, tokens[start : start + BLOCK])
        hashes.append(parent)
    return [maybe_convert_block_hash(h) for h in hashes]


class Router:
    def __init__(self, replicas: list[Replica], prefix_aware: bool) -> None:
        self.replicas, self.prefix_aware, self.turn = replicas, prefix_aware, count()

    def pick(self, tokens: list[int]) -> Replica:
        order = next(self.turn)
        if not self.prefix_aware:
            return self.replicas[order % len(self.replicas)]
        hashes = block_hashes(tokens)

        def score(replica: Replica) -> tuple[int, int, int]:
            held = 0
            while held < len(hashes) and hashes[held] in replica.held:
                held += 1
            return held, -replica.in_flight, -((replica.index - order) % len(self.replicas))

        return max(self.replicas, key=score)


async def completion(session, replica: Replica, model: str, tokens: list[int], output_len: int):
    """A streamed greedy completion: (TTFT ms, answer token ids, cached tokens)."""
    body = {"model": model, "prompt": tokens, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start, ttft, answer, cached = time.perf_counter(), None, [], 0
    replica.in_flight += 1
    try:
        async with session.post(f"http://{HOST}:{replica.port}/v1/completions", json=body) as response:
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: ") :])
                for choice in event.get("choices", []):
                    if choice.get("token_ids") and ttft is None:
                        ttft = (time.perf_counter() - start) * 1000
                    answer += choice.get("token_ids") or []
                usage = event.get("usage")
                if usage:
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    finally:
        replica.in_flight -= 1
    return ttft, answer, cached


async def conversation(session, router: Router, args, model: str, name: str, rnd: int, index: int, vocab: int):
    rng = random.Random(f"{rnd}-{index}")
    history = [rng.randrange(100, vocab) for _ in range(args.first_len)]
    turns = []
    for turn in range(args.turns):
        replica = router.pick(history)
        ttft, answer, cached = await completion(session, replica, model, history, args.output_len)
        turns.append(Turn(name, rnd, index, turn, replica.index, ttft, len(history), cached))
        history = history + answer + [rng.randrange(100, vocab) for _ in range(args.question_len)]
    return turns


async def run_round(replicas, args, model: str, name: str, rnd: int, vocab: int) -> list[Turn]:
    router = Router(replicas, prefix_aware=name == "prefix-aware")
    limit = asyncio.Semaphore(args.concurrency)

    async def one(index: int):
        async with limit:
            return await conversation(session, router, args, model, name, rnd, index, vocab)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        results = await asyncio.gather(*(one(i) for i in range(args.conversations)))
    return [t for turns in results for t in turns]


def summary(turns: list[Turn], args, command: str) -> str:
    rows = {}
    for name in ("round-robin", "prefix-aware"):
        mine = [t for t in turns if t.router == name]
        later = [t for t in mine if t.turn > 0]
        rows[name] = (
            statistics.median(t.ttft_ms for t in mine),
            statistics.median(t.ttft_ms for t in later),
            sum(t.cached_tokens for t in mine) / sum(t.prompt_tokens for t in mine),
        )
    rr, kv = rows["round-robin"], rows["prefix-aware"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")
    lines = [
        "# Prefix-aware routing by KV-cache events vs round robin (two replicas)",
        "",
        f"commit {commit}; host: {cpu}, {os.cpu_count()} CPUs shared with other work (loaded: compare the ratios).",
        f"command: `{command}`",
        f"{args.conversations} conversations x {args.turns} turns, {args.concurrency} at a time; first turn "
        f"{args.first_len} tokens, then {args.question_len}-token questions; {args.output_len} output tokens; "
        f"{args.rounds} rounds per router, alternated; block size {BLOCK}.",
        "",
        "| router | TTFT p50 ms (all turns) | TTFT p50 ms (turns 2+) | prefix-cache hit rate |",
        "|---|---|---|---|",
        *(f"| {name} | {a:.0f} | {b:.0f} | {c:.1%} |" for name, (a, b, c) in rows.items()),
        "",
        f"prefix-aware / round robin: TTFT p50 {kv[0] / rr[0]:.2f}x (turns 2+: {kv[1] / rr[1]:.2f}x), hit rate "
        f"{kv[2] / max(rr[2], 1e-9):.2f}x",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--first-len", type=int, default=300)
    parser.add_argument("--question-len", type=int, default=24)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8310)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    config = json.loads((args.artifact / "config.json").read_text())
    replicas = [
        Replica(args.artifact, i, args.port + i, args.port + 10 + i, args.out / f"replica{i}.log") for i in (0, 1)
    ]
    stop = threading.Event()
    try:
        for replica in replicas:
            replica.wait_ready()
        threading.Thread(target=follow_events, args=(replicas, stop), daemon=True).start()
        time.sleep(1)
        model = str(args.artifact)
        turns: list[Turn] = []
        for rnd in range(args.rounds):
            for name in ("round-robin", "prefix-aware"):
                turns += asyncio.run(run_round(replicas, args, model, name, 2 * rnd + (name == "prefix-aware"),
                                               config["vocab_size"]))  # fmt: skip
                print(f"round {rnd} {name}: {len(turns)} turns so far", flush=True)
    finally:
        stop.set()
        for replica in replicas:
            replica.stop()
    (args.out / "turns.json").write_text(json.dumps([asdict(t) for t in turns], indent=0))
    text = summary(turns, args, " ".join(["benchmark/workloads/kv_router.py", *sys.argv[1:]]))
    (args.out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
