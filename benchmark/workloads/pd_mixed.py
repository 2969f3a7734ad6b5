"""Mixed traffic on 1P1D against one instance of the same cores, and the host KV tier's hit against a recomputed prefill.

    .venv/bin/python benchmark/workloads/pd_mixed.py ARTIFACT --out DIR [--long-len 3000 --longs 4 --decoders 3]

Three setups of ARTIFACT on 127.0.0.1, one after another:
- single: one `vllm serve` pinned to cores 0-1 (taskset, OMP_NUM_THREADS=2), the plugin's default prefill mode, a
  pool of 2 x pool_blocks (the two P/D servers' KV memory);
- 1P1D: a kv_producer pinned to core 0 and a kv_consumer pinned to core 1 (one thread each), PromptStorageConnector
  over a directory, behind benchmark/tools/pd_proxy.py;
- host tier: one server on cores 0-1 with OffloadingConnector and a pool too small for two long prompts.
Mixed traffic (single and 1P1D, the same seeded tokens): `decoders` streams of short chats (short_len-token prompts,
output_len tokens each, a closed loop) while `longs` long prompts (long_len tokens, long_output tokens) arrive every
long_every seconds. Reported: the short chats' inter-token latency p50/p99 while the long prompts run, TTFT p50 of
short chats and of long prompts, and the decode server's prefill graph calls (its runner's records, ONP_STATS_FILE).
Host tier: a long prompt, then fillers that evict its blocks from the pool, then the prompt again (TTFT of the host
hit) against an unseen prompt of the same length (TTFT of a recomputed prefill), `host_rounds` times.
Writes summary.md and requests.json in DIR.
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
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "benchmark" / "tools" / "pd_proxy.py"
VLLM = Path(sys.executable).parent / "vllm"


@dataclass
class Record:
    setup: str
    kind: str  # short | long | hit | recompute
    prompt_tokens: int
    ttft_ms: float
    gaps_ms: list[float] = field(default_factory=list)  # between streamed tokens
    started: float = 0.0  # seconds since the setup's traffic began


class Process:
    """A background process in its own session, its output to `log`, stopped by its group."""

    def __init__(self, command: list[str], log: Path, cores: str | None = None, **env: str) -> None:
        command = ["taskset", "-c", cores, *command] if cores else command
        full_env = {**os.environ, "ONP_BACKEND": "cpu", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", **env}
        self.process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=full_env,
                                        start_new_session=True)  # fmt: skip

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def serve(artifact: Path, port: int, log: Path, cores: str, threads: int, *args: str, **env: str) -> Process:
    command = [str(VLLM), "serve", str(artifact), "--host", HOST, "--port", str(port), *args]
    return Process(command, log, cores, OMP_NUM_THREADS=str(threads), **env)


def wait_ready(port: int, process: Process, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.process.poll() is not None:
            raise SystemExit(f"server on port {port} exited with {process.process.returncode}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"server on port {port} not ready after {timeout} s")


async def stream(session, port: int, model: str, tokens: list[int], max_tokens: int) -> tuple[float, list[float]]:
    """A streamed greedy completion: (TTFT ms, gaps between tokens ms)."""
    body = {"model": model, "prompt": tokens, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True}  # fmt: skip
    start = time.perf_counter()
    times = []
    async with session.post(f"http://{HOST}:{port}/v1/completions", json=body) as response:
        if response.status != 200:
            raise SystemExit(f"HTTP {response.status}: {await response.text()}")
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                times.append(time.perf_counter())
    gaps = [(b - a) * 1000 for a, b in zip(times, times[1:], strict=False)]
    return (times[0] - start) * 1000, gaps


def prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(100, vocab) for _ in range(length)]


async def mixed(port: int, setup: str, args, model: str, vocab: int) -> list[Record]:
    rng = random.Random(args.seed)
    longs = [prompt(rng, args.long_len, vocab) for _ in range(args.longs)]
    shorts = [[prompt(rng, args.short_len, vocab) for _ in range(200)] for _ in range(args.decoders)]
    records: list[Record] = []
    began, done = time.perf_counter(), asyncio.Event()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:

        async def decoder(index: int) -> None:
            for tokens in shorts[index]:
                if done.is_set():
                    return
                started = time.perf_counter() - began
                ttft, gaps = await stream(session, port, model, tokens, args.output_len)
                records.append(Record(setup, "short", len(tokens), ttft, gaps, started))

        async def long_prompts() -> None:
            await asyncio.sleep(args.long_every / 2)
            pending = []
            for tokens in longs:
                started = time.perf_counter() - began

                async def one(tokens=tokens, started=started) -> None:
                    ttft, gaps = await stream(session, port, model, tokens, args.long_output)
                    records.append(Record(setup, "long", len(tokens), ttft, gaps, started))

                pending.append(asyncio.create_task(one()))
                await asyncio.sleep(args.long_every)
            await asyncio.gather(*pending)
            done.set()

        await asyncio.gather(long_prompts(), *(decoder(i) for i in range(args.decoders)))
    return records


async def host_tier(port: int, args, model: str, vocab: int) -> list[Record]:
    rng = random.Random(args.seed + 1)
    records = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        for _ in range(args.host_rounds):
            target = prompt(rng, args.long_len, vocab)
            await stream(session, port, model, target, 1)
            for _ in range(args.fillers):  # their blocks push the target's out of the pool
                await stream(session, port, model, prompt(rng, args.long_len, vocab), 1)
            ttft, _ = await stream(session, port, model, target, 1)
            records.append(Record("host tier", "hit", len(target), ttft))
            ttft, _ = await stream(session, port, model, prompt(rng, args.long_len, vocab), 1)
            records.append(Record("host tier", "recompute", args.long_len, ttft))
    return records


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            key = name.split("{")[0]
            values[key] = values.get(key, 0.0) + float(value)
    return values


def run_single(args, model: str, vocab: int) -> list[Record]:
    # The KV memory of the two P/D servers together.
    pool = ("--num-gpu-blocks-override", str(2 * args.pool_blocks)) if args.pool_blocks else ()
    server = serve(args.artifact, args.port, args.out / "single.log", "0-1", 2, *pool)
    try:
        wait_ready(args.port, server)
        return asyncio.run(mixed(args.port, "single", args, model, vocab))
    finally:
        server.stop()


def run_pd(args, model: str, vocab: int, storage: Path) -> tuple[list[Record], list[dict]]:
    def kv(role: str) -> str:
        return json.dumps({"kv_connector": "PromptStorageConnector", "kv_role": role,
                           "kv_connector_module_path": "optimum_neuron_plugin.vllm.prompt_storage",
                           "kv_connector_extra_config": {"shared_storage_path": str(storage)}})  # fmt: skip

    stats = args.out / "decode.jsonl"
    stats.unlink(missing_ok=True)
    prefill = serve(args.artifact, args.port + 1, args.out / "prefill.log", "0", 1, *args.pool,
                    "--kv-transfer-config", kv("kv_producer"))  # fmt: skip
    decode = serve(args.artifact, args.port + 2, args.out / "decode.log", "1", 1, *args.pool,
                   "--kv-transfer-config", kv("kv_consumer"), ONP_STATS_FILE=str(stats))  # fmt: skip
    proxy = Process([sys.executable, str(PROXY), "--port", str(args.port), "--prefill", f"http://{HOST}:{args.port + 1}",
                     "--decode", f"http://{HOST}:{args.port + 2}"], args.out / "proxy.log")  # fmt: skip
    try:
        wait_ready(args.port + 1, prefill)
        wait_ready(args.port + 2, decode)
        records = asyncio.run(mixed(args.port, "1P1D", args, model, vocab))
        # The runner records a request when the next step tells it the request finished: one more step.
        asyncio.run(one_token(args.port + 2, model))
        return records, [json.loads(line) for line in stats.read_text().splitlines()]
    finally:
        for process in (proxy, decode, prefill):
            process.stop()


async def one_token(port: int, model: str) -> None:
    async with aiohttp.ClientSession() as session:
        await stream(session, port, model, [1, 2, 3], 1)


def run_host_tier(args, model: str, vocab: int) -> tuple[list[Record], dict[str, float]]:
    config = json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                         "kv_connector_extra_config": {"cpu_bytes_to_use": args.host_bytes}})  # fmt: skip
    blocks = ("--num-gpu-blocks-override", str(args.host_pool_blocks))
    server = serve(args.artifact, args.port, args.out / "host-tier.log", "0-1", 2, *blocks,
                   "--kv-transfer-config", config)  # fmt: skip
    try:
        wait_ready(args.port, server)
        records = asyncio.run(host_tier(args.port, args, model, vocab))
        return records, metrics(args.port)
    finally:
        server.stop()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def during_longs(records: list[Record]) -> list[float]:
    """The short chats' gaps while a long prompt was in the system (from its arrival to its last token)."""
    longs = [r for r in records if r.kind == "long"]
    end = max(r.started + (r.ttft_ms + sum(r.gaps_ms)) / 1000 for r in longs)
    return [g for r in records if r.kind == "short" and r.started < end for g in r.gaps_ms]


def summary(records: list[Record], decode_stats: list[dict], host: dict[str, float], args, command: str) -> str:
    rows = {}
    for setup in ("single", "1P1D"):
        mine = [r for r in records if r.setup == setup]
        gaps = during_longs(mine)
        rows[setup] = (
            pct(gaps, 0.5), pct(gaps, 0.99), len(gaps),
            statistics.median(r.ttft_ms for r in mine if r.kind == "short"),
            statistics.median(r.ttft_ms for r in mine if r.kind == "long"),
        )  # fmt: skip
    single, pd = rows["single"], rows["1P1D"]
    hits = [r.ttft_ms for r in records if r.kind == "hit"]
    recomputed = [r.ttft_ms for r in records if r.kind == "recompute"]
    transferred = [s for s in decode_stats if s["prompt_tokens"] > 3]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    lines = [
        "# P/D (1P1D, one core each) vs one instance on both cores: mixed traffic; host KV tier hit vs recompute",
        "",
        f"commit {commit}; host: {cpu.split(':', 1)[-1].strip()}, {os.cpu_count()} CPUs (timing runs hold "
        "/work/cpu.lock exclusively).",
        f"command: `{command}`",
        f"artifact: {args.artifact.name}; pool {args.pool_blocks or 'the artifact'} blocks per P/D server, twice that "
        "on the single one (the same KV memory). "
        f"{args.decoders} streams of short chats ({args.short_len}-token prompts, {args.output_len} tokens each) "
        f"while {args.longs} prompts of {args.long_len} tokens ({args.long_output} output tokens) arrive every "
        f"{args.long_every} s; greedy.",
        "",
        "| setup | short chats' ITL p50 ms | ITL p99 ms | gaps | TTFT p50 ms short | TTFT p50 ms long |",
        "|---|---|---|---|---|---|",
        *(f"| {name} | {a:.1f} | {b:.1f} | {n} | {c:.0f} | {d:.0f} |" for name, (a, b, n, c, d) in rows.items()),
        "",
        f"1P1D / single: ITL p99 {pd[1] / single[1]:.2f}x (p50 {pd[0] / single[0]:.2f}x), TTFT p50 short "
        f"{pd[3] / single[3]:.2f}x, long {pd[4] / single[4]:.2f}x.",
        f"The decode server's prefill graph calls for the {len(transferred)} requests it served: "
        f"{sum(s['prefill_calls'] for s in transferred)} (its runner's records; cached tokens "
        f"{sum(s['cached_tokens'] for s in transferred)} of {sum(s['prompt_tokens'] for s in transferred)} prompt "
        "tokens).",
        "",
        f"## Host KV tier ({args.host_rounds} rounds, pool {args.host_pool_blocks} blocks, {args.fillers} fillers)",
        "",
        "| TTFT of a long prompt | p50 ms | all ms |",
        "|---|---|---|",
        f"| served from host memory (evicted from the pool) | {statistics.median(hits):.0f} | "
        f"{', '.join(f'{t:.0f}' for t in hits)} |",
        f"| recomputed (an unseen prompt) | {statistics.median(recomputed):.0f} | "
        f"{', '.join(f'{t:.0f}' for t in recomputed)} |",
        "",
        f"host hit / recompute: {statistics.median(hits) / statistics.median(recomputed):.2f}x; external prefix-cache "
        f"hits {host.get('vllm:external_prefix_cache_hits_total', 0):.0f} tokens, offload store / load bytes "
        f"{host.get('vllm:kv_offload_store_bytes_total', 0):.3g} / {host.get('vllm:kv_offload_load_bytes_total', 0):.3g}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--long-len", type=int, default=3000)
    parser.add_argument("--long-output", type=int, default=16)
    parser.add_argument("--longs", type=int, default=4)
    parser.add_argument("--long-every", type=float, default=4.0)
    parser.add_argument("--short-len", type=int, default=100)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--decoders", type=int, default=3)
    parser.add_argument("--pool-blocks", type=int, default=64)
    parser.add_argument("--host-pool-blocks", type=int, default=40)
    parser.add_argument("--host-bytes", type=int, default=1_000_000_000)
    parser.add_argument("--host-rounds", type=int, default=2)
    parser.add_argument("--fillers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8330)
    parser.add_argument("--skip", choices=("single", "pd", "host"), action="append", default=[])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.pool = ("--num-gpu-blocks-override", str(args.pool_blocks)) if args.pool_blocks else ()
    vocab = json.loads((args.artifact / "config.json").read_text())["vocab_size"]
    model = str(args.artifact)
    records, decode_stats, host = [], [], {}
    if "single" not in args.skip:
        records += run_single(args, model, vocab)
        print("single done", flush=True)
    if "pd" not in args.skip:
        with tempfile.TemporaryDirectory(prefix="pd-kv-") as storage:
            pd, decode_stats = run_pd(args, model, vocab, Path(storage))
        records += pd
        print("1P1D done", flush=True)
    if "host" not in args.skip:
        tier, host = run_host_tier(args, model, vocab)
        records += tier
    (args.out / "requests.json").write_text(json.dumps([asdict(r) for r in records], indent=0))
    text = summary(records, decode_stats, host, args, " ".join(["benchmark/workloads/pd_mixed.py", *sys.argv[1:]]))
    (args.out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
