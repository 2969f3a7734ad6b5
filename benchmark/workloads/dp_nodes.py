"""Data-parallel throughput: one engine, two engines on one node, two "nodes" (a head and a headless node) on 127.0.0.1.

    .venv/bin/python benchmark/workloads/dp_nodes.py ARTIFACT --out DIR [--rounds 2 --concurrency 8 --num-prompts 16]

Each configuration gives every engine one CPU thread (OMP_NUM_THREADS=1 per process): `one` serves 1 engine,
`dp2` serves `--data-parallel-size 2` (vLLM splits the server's 2 threads, one per engine), `nodes2` a head
(`--data-parallel-size 2 --data-parallel-size-local 1`) and a `--headless --data-parallel-start-rank 1` node. Each is
driven by `vllm bench serve` (random dataset, ignore EOS), the three alternated round after round. Writes summary.md
(output tok/s per configuration, the ratio to `one`, TTFT p50) and the bench results in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"
VLLM = str(Path(sys.executable).parent / "vllm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start(artifact: Path, port: int, args: list[str], log: Path, threads: int) -> subprocess.Popen:
    env = {**os.environ, "ONP_BACKEND": "cpu", "OMP_NUM_THREADS": str(threads), "VLLM_NO_USAGE_STATS": "1"}
    command = [VLLM, "serve", str(artifact), "--host", HOST, "--port", str(port), *args]
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_ready(port: int, processes: list[subprocess.Popen], timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            raise SystemExit("a server exited before it was ready")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"not ready after {timeout} s")


def stop(processes: list[subprocess.Popen]) -> None:
    for process in reversed(processes):
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def serve(config: str, artifact: Path, port: int, out: Path) -> list[subprocess.Popen]:
    if config == "one":
        return [start(artifact, port, [], out / "server.log", 1)]
    if config == "dp2":
        return [start(artifact, port, ["--data-parallel-size", "2"], out / "server.log", 2)]
    dp = ["--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-address", HOST,
          "--data-parallel-rpc-port", str(free_port())]  # fmt: skip
    head = start(artifact, port, dp, out / "head.log", 1)
    node = start(artifact, free_port(), [*dp, "--headless", "--data-parallel-start-rank", "1"], out / "node.log", 1)
    return [head, node]


def bench(artifact: Path, port: int, args, out: Path) -> dict:
    command = [VLLM, "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions", "--base-url",
               f"http://{HOST}:{port}", "--model", str(artifact), "--dataset-name", "random", "--random-input-len",
               str(args.input_len), "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
               "--seed", "0", "--ignore-eos", "--max-concurrency", str(args.concurrency), "--num-warmups", "1",
               "--save-result", "--result-dir", str(out), "--result-filename", "bench.json", "--disable-tqdm"]  # fmt: skip
    with (out / "bench.log").open("w") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True)
    result = json.loads((out / "bench.json").read_text())
    if result.get("completed") != args.num_prompts or result.get("failed"):
        raise SystemExit(f"requests failed: {out / 'bench.log'}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args()
    configs = ("one", "dp2", "nodes2")
    results: dict[str, list[dict]] = {c: [] for c in configs}
    for rnd in range(args.rounds):
        for config in configs:
            out = args.out / f"{config}-{rnd}"
            out.mkdir(parents=True, exist_ok=True)
            port = free_port()
            processes = serve(config, args.artifact, port, out)
            try:
                wait_ready(port, processes)
                results[config].append(bench(args.artifact, port, args, out))
            finally:
                stop(processes)
            print(f"round {rnd} {config}: {results[config][-1]['output_throughput']:.1f} out tok/s", flush=True)
    base = statistics.mean(r["output_throughput"] for r in results["one"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")
    lines = [
        "# Data-parallel throughput: 1 engine, DP 2 on one node, DP 2 as two nodes (head + headless)",
        "",
        f"commit {commit}; host: {cpu}, {os.cpu_count()} CPUs shared with other work (loaded: compare the ratios).",
        f"command: `benchmark/workloads/dp_nodes.py {' '.join(sys.argv[1:])}`",
        f"vllm bench serve, random {args.input_len} in / {args.output_len} out, {args.num_prompts} prompts, concurrency "
        f"{args.concurrency}; one thread per engine; {args.rounds} rounds alternated (mean).",
        "",
        "| configuration | out tok/s | ratio to one engine | TTFT p50 ms |",
        "|---|---|---|---|",
    ]
    for config in configs:
        tput = statistics.mean(r["output_throughput"] for r in results[config])
        ttft = statistics.mean(r["median_ttft_ms"] for r in results[config])
        lines.append(f"| {config} | {tput:.1f} | {tput / base:.2f}x | {ttft:.0f} |")
    text = "\n".join(lines) + "\n"
    (args.out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
