"""Mixed chat lengths at a fixed concurrency: what a block pool buys over full-length cache rows.

    python benchmark/workloads/mixed_chat.py --base-url http://127.0.0.1:8200 --result out.json [--clients 32]

REQUESTS requests, CLIENTS at a time (closed loops), each a prompt of random token ids and an output length drawn
from fixed-seed log-normal distributions clipped to [PROMPT_MIN, PROMPT_MAX] and [OUTPUT_MIN, OUTPUT_MAX] (chat
traffic: most requests short, a few long), a prompt cut to the server's max_model_len less its output. Greedy,
ignore_eos, streamed to /v1/completions. The same seed gives the same requests to every server of the same
max_model_len. Writes one record per request and a summary: output tok/s over the run, TTFT
p50/p99, the lengths drawn, and what the server's /metrics counted during the run (preemptions, prompt tokens,
prefix-cache queries and hits): a preempted request is prefilled again, which costs throughput the lengths do not show.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from pathlib import Path

import aiohttp
from sse import stream_events


def draw(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


def requests(args: argparse.Namespace, max_model_len: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per request; ids avoid the first 100 ids (special tokens in most vocabs)."""
    rng = random.Random(args.seed)
    drawn = []
    for _ in range(args.requests):
        prompt_len = draw(rng, args.prompt_median, args.sigma, args.prompt_min, args.prompt_max)
        output_len = draw(rng, args.output_median, args.sigma, args.output_min, args.output_max)
        prompt_len = min(prompt_len, max_model_len - output_len)
        drawn.append(([rng.randrange(100, args.vocab) for _ in range(prompt_len)], output_len))
    return drawn


async def complete(session: aiohttp.ClientSession, url: str, model: str, prompt: list[int], output: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": output, "temperature": 0.0, "ignore_eos": True}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    start, first, usage = time.perf_counter(), None, {}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        async for event in stream_events(response):
            if any(choice.get("text") for choice in event.get("choices", [])):
                first = first or time.perf_counter()
            usage = event.get("usage") or usage
    end = time.perf_counter()
    return {
        "prompt_tokens": len(prompt),
        "completion_tokens": usage.get("completion_tokens", 0),
        "ttft_ms": 1000 * ((first or end) - start),
        "latency_ms": 1000 * (end - start),
    }


COUNTERS = ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits")


async def counters(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """COUNTERS summed over their labels, from the server's Prometheus text (counters end in _total)."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        name, _, value = line.partition("{") if "{" in line else line.partition(" ")
        name = name.removesuffix("_total")
        if name in totals and not line.startswith("#"):
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


async def run(args: argparse.Namespace) -> dict:
    records: list[dict] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        async with session.get(f"{args.base_url}/v1/models") as response:
            served = (await response.json())["data"][0]
        model = served["id"]
        drawn = requests(args, served["max_model_len"])
        queue: asyncio.Queue = asyncio.Queue()
        for item in drawn:
            queue.put_nowait(item)

        async def client() -> None:
            while not queue.empty():
                prompt, output = queue.get_nowait()
                records.append(await complete(session, args.base_url, model, prompt, output))

        before = await counters(session, args.base_url)
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.clients)))
        duration = time.perf_counter() - start
        after = await counters(session, args.base_url)
    ttfts = sorted(r["ttft_ms"] for r in records)
    output_tokens = sum(r["completion_tokens"] for r in records)
    return {
        "clients": args.clients,
        "requests": len(records),
        "duration_s": duration,
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / duration,
        "ttft_ms": {"p50": statistics.median(ttfts), "p99": ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))]},
        "prompt_tokens": {"total": sum(len(p) for p, _ in drawn), "max": max(len(p) for p, _ in drawn)},
        "server_counters": {name.removeprefix("vllm:"): after[name] - before[name] for name in COUNTERS},
        "records": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-median", type=float, default=300)
    parser.add_argument("--prompt-min", type=int, default=64)
    parser.add_argument("--prompt-max", type=int, default=3000)
    parser.add_argument("--output-median", type=float, default=96)
    parser.add_argument("--output-min", type=int, default=32)
    parser.add_argument("--output-max", type=int, default=512)
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of both lengths")
    parser.add_argument("--vocab", type=int, default=49152, help="token ids are drawn below this")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"[mixed-chat] {result['requests']} requests, {args.clients} clients: {result['output_tok_s']:.1f} output tok/s, "
        f"TTFT p50 {result['ttft_ms']['p50']:.0f} ms p99 {result['ttft_ms']['p99']:.0f} ms, "
        f"{result['server_counters']['num_preemptions']:.0f} preemptions",
        flush=True,
    )


if __name__ == "__main__":
    main()
