"""Scenario: long prompts arrive while short requests decode; one short request is queued behind each.

    .venv/bin/python benchmark/workloads/interleave.py --name chunked-hybrid --url http://127.0.0.1:8200 \
        --model-dir ARTIFACT --out RUN_DIR/interleave-chunked-hybrid.json

Run it against the same artifact served in serial mode (chunked-hybrid) and in interleaved mode
(chunked-interleaved); collect.py puts the two side by side with interleaved/serial ratios.

1. `--decoders` requests (short prompt, output unbounded) start and decode; once each has streamed
   `--warm-tokens` tokens the measured phase begins.
2. `--rounds` times: a long prompt (`--long-len` tokens: several prefill chunks) is sent, then
   `--short-delay` s later a short request; both are awaited.
3. The decoders are cancelled at the end of the phase.

Reported: the decoders' inter-token latency (gaps between streamed tokens) p50/p99/max during the
phase and before it, the TTFT of the queued short requests and of the long prompts, and (with
`--stats-file`, the server's ONP_STATS_FILE) the long prompts' prefill chunk calls and whether
their prefill ran interleaved with decodes. Prompts are token ids (exact lengths), greedy, EOS ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


class Stream:
    """One streamed completion: token arrival times."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.sent = 0.0
        self.arrivals: list[float] = []
        self.tokens = 0

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0] - self.sent if self.arrivals else None


async def stream_completion(
    session: aiohttp.ClientSession, url: str, model: str, prompt: list[int], max_tokens: int, stream: Stream
) -> Stream:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    # The request id names the request in the server's ONP_STATS_FILE lines.
    headers = {"X-Request-Id": f"interleave-{stream.label}-{random.getrandbits(32):08x}"}
    stream.sent = time.perf_counter()
    async with session.post(f"{url}/v1/completions", json=body, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"{stream.label}: HTTP {response.status}: {await response.text()}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            choices = json.loads(data).get("choices") or []
            if not choices:
                continue
            ids = choices[0].get("token_ids")
            count = len(ids) if ids is not None else (1 if choices[0].get("text") else 0)
            if count:
                stream.arrivals.append(time.perf_counter())
                stream.tokens += count
    return stream


def stats_ms(values: list[float]) -> dict:
    if not values:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None}
    data = np.asarray(values) * 1000
    return {
        "count": len(values),
        "p50_ms": float(np.percentile(data, 50)),
        "p99_ms": float(np.percentile(data, 99)),
        "max_ms": float(data.max()),
        "mean_ms": float(data.mean()),
    }


def gaps_within(arrivals: list[float], start: float, end: float) -> list[float]:
    """Gaps between consecutive arrivals whose later arrival falls in [start, end]."""
    return [b - a for a, b in zip(arrivals, arrivals[1:], strict=False) if start <= b <= end]


async def scenario(args) -> dict:
    rng = random.Random(args.seed)
    low, high = 100, min(args.vocab_size, 30000)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(low, high) for _ in range(n)]

    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        models = await (await session.get(f"{args.url}/v1/models")).json()
        model = models["data"][0]["id"]
        # Warm-up: one long and one short request through every graph before measuring.
        await stream_completion(session, args.url, model, tokens(args.long_len), 2, Stream("warmup-long"))
        await stream_completion(session, args.url, model, tokens(args.short_len), 2, Stream("warmup-short"))

        decode_budget = args.sequence_length - args.short_len - 1
        decoders = [Stream(f"decoder-{i}") for i in range(args.decoders)]
        tasks = [
            asyncio.create_task(stream_completion(session, args.url, model, tokens(args.short_len), decode_budget, d))
            for d in decoders
        ]
        deadline = time.perf_counter() + args.timeout
        while any(d.tokens < args.warm_tokens for d in decoders):
            for task in tasks:
                if task.done() and task.exception():
                    raise task.exception()
            if time.perf_counter() > deadline:
                raise TimeoutError("decoders did not start")
            await asyncio.sleep(0.01)
        phase_start = time.perf_counter()
        longs, shorts = [], []
        for r in range(args.rounds):
            long = Stream(f"long-{r}")
            short = Stream(f"short-{r}")
            long_task = asyncio.create_task(
                stream_completion(session, args.url, model, tokens(args.long_len), args.long_output, long)
            )
            await asyncio.sleep(args.short_delay)
            short_task = asyncio.create_task(
                stream_completion(session, args.url, model, tokens(args.queued_len), args.short_output, short)
            )
            await asyncio.gather(long_task, short_task)
            longs.append(long)
            shorts.append(short)
            await asyncio.sleep(args.round_gap)
        phase_end = time.perf_counter()
        finished_early = [d.label for d in decoders if tasks[decoders.index(d)].done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    during = [g for d in decoders for g in gaps_within(d.arrivals, phase_start, phase_end)]
    before = [g for d in decoders for g in gaps_within(d.arrivals, 0.0, phase_start)][1:]
    return {
        "decoders": args.decoders,
        "rounds": args.rounds,
        "long_len": args.long_len,
        "short_len": args.short_len,
        "queued_len": args.queued_len,
        "chunk_size": args.chunk_size,
        "short_delay": args.short_delay,
        "round_gap": args.round_gap,
        "phase_seconds": phase_end - phase_start,
        "decoders_finished_early": finished_early,
        "decode_itl_during": stats_ms(during),
        "decode_itl_before": stats_ms(before),
        "queued_short_ttft": stats_ms([s.ttft for s in shorts if s.ttft is not None]),
        "long_ttft": stats_ms([s.ttft for s in longs if s.ttft is not None]),
        "decode_tokens_during": int(sum(1 for d in decoders for t in d.arrivals if phase_start <= t <= phase_end)),
    }


def prefill_facts(stats_file: Path | None, before: int) -> dict:
    """Chunk calls, engine steps and seconds of the long and the queued short prompts' prefills."""
    if stats_file is None or not stats_file.is_file():
        return {}
    lines = stats_file.read_text().splitlines()[before:]
    records = [json.loads(line) for line in lines if line.strip()]
    facts = {}
    for kind in ("long", "short"):
        mine = [r for r in records if f"interleave-{kind}-" in str(r.get("req_id"))]
        if not mine:
            continue
        facts.update(
            {
                f"{kind}_prefill_calls": float(np.mean([r["prefill_calls"] for r in mine])),
                f"{kind}_prefill_steps": float(np.mean([r.get("prefill_steps", 0) for r in mine])),
                f"{kind}_prefill_seconds": float(np.mean([r["prefill_seconds"] for r in mine])),
                f"{kind}_interleaved_fraction": float(np.mean([bool(r.get("interleaved")) for r in mine])),
            }
        )
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="configuration name (recorded in the result)")
    parser.add_argument("--url", required=True)
    parser.add_argument("--model-dir", required=True, type=Path, help="the served artifact (reads config.json)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--stats-file", type=Path, help="the server's ONP_STATS_FILE")
    batch = env_int("BATCH_SIZE", 4)
    chunk = env_int("CHUNK_SIZE", 128)
    sequence_length = env_int("SEQUENCE_LENGTH", 1024)
    parser.add_argument("--batch-size", type=int, default=batch)
    parser.add_argument("--chunk-size", type=int, default=chunk)
    parser.add_argument("--sequence-length", type=int, default=sequence_length)
    parser.add_argument("--decoders", type=int, default=env_int("INTERLEAVE_DECODERS", max(batch - 2, 1)))
    parser.add_argument("--rounds", type=int, default=env_int("INTERLEAVE_ROUNDS", 2))
    default_long = min(env_int("INTERLEAVE_CHUNKS", 4) * chunk, sequence_length - 16)
    parser.add_argument("--long-len", type=int, default=env_int("INTERLEAVE_LONG_LEN", default_long))
    parser.add_argument("--short-len", type=int, default=env_int("INTERLEAVE_SHORT_LEN", 16))
    parser.add_argument(
        "--queued-len",
        type=int,
        default=env_int("INTERLEAVE_QUEUED_LEN", 17),
        help="the short request behind each long one",
    )
    parser.add_argument("--long-output", type=int, default=4)
    parser.add_argument("--short-output", type=int, default=4)
    parser.add_argument("--warm-tokens", type=int, default=4)
    parser.add_argument("--short-delay", type=float, default=0.05, help="seconds between a long and its short")
    parser.add_argument("--round-gap", type=float, default=0.3, help="seconds of plain decoding between rounds")
    parser.add_argument("--seed", type=int, default=env_int("SEED", 0))
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    if args.decoders + 2 > args.batch_size:
        print(
            f"[interleave] note: {args.decoders} decoders + long + short exceed batch {args.batch_size}: "
            "some requests wait for a slot",
            file=sys.stderr,
        )
    config = json.loads((args.model_dir / "config.json").read_text())
    args.vocab_size = int(config["vocab_size"])
    before = len(args.stats_file.read_text().splitlines()) if args.stats_file and args.stats_file.is_file() else 0
    result = {"name": args.name, **asyncio.run(scenario(args))}
    time.sleep(0.5)  # the runner writes a request's stats line just after its last token
    result.update(prefill_facts(args.stats_file, before))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    during, short = result["decode_itl_during"], result["queued_short_ttft"]
    print(
        f"[interleave] {args.name}: decode ITL while long prompts arrive p50 {during['p50_ms']:.1f} ms, "
        f"max {during['max_ms']:.1f} ms; queued short TTFT p50 {short['p50_ms']:.0f} ms; "
        f"long TTFT p50 {result['long_ttft']['p50_ms']:.0f} ms; chunk calls long {result.get('long_prefill_calls')}, "
        f"short {result.get('short_prefill_calls')}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
