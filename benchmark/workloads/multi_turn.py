"""Multi-turn chat workload: conversations whose every turn resends the whole history to /v1/chat/completions.

    python benchmark/workloads/multi_turn.py --base-url http://127.0.0.1:8200 --tokenizer DIR --result out.json

CONVERSATIONS conversations of TURNS turns, CONCURRENCY at a time (each one a closed loop: its next turn is sent when
the previous answer is in). Turn 1 is a FIRST_LEN-token user message (a document with a question), every later turn
a QUESTION_LEN-token user message after the history (the earlier messages and the model's answers, as text). Greedy,
OUTPUT_LEN tokens per answer (ignore_eos), streamed: TTFT is the time to the first content token. Writes one record
per request and a summary (TTFT p50/p99 over all turns and over the turns after the first, output tok/s over the
whole run, prompt and cached tokens when the server reports them: --enable-prompt-tokens-details).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from sse import stream_events
from transformers import AutoTokenizer


@dataclass
class Turn:
    conversation: int
    turn: int
    ttft_ms: float
    latency_ms: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None


def random_text(tokenizer, rng: random.Random, num_tokens: int) -> str:
    """About num_tokens tokens of text: random vocabulary ids (special tokens left out), decoded."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in (rng.randrange(tokenizer.vocab_size) for _ in range(2 * num_tokens)) if i not in special]
    text = tokenizer.decode(ids[:num_tokens])
    return tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids[:num_tokens])


def conversation_messages(tokenizer, args, seed: int) -> list[str]:
    rng = random.Random(seed)
    first = random_text(tokenizer, rng, args.first_len)
    return [first] + [random_text(tokenizer, rng, args.question_len) for _ in range(args.turns - 1)]


async def chat_turn(session: aiohttp.ClientSession, args, model: str, messages: list[dict]) -> tuple[Turn, str]:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": args.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first, text, usage = None, [], {}
    async with session.post(f"{args.base_url}/v1/chat/completions", json=body) as response:
        async for event in stream_events(response):
            for choice in event.get("choices", []):
                content = choice.get("delta", {}).get("content")
                if content:
                    first = first or time.perf_counter()
                    text.append(content)
            usage = event.get("usage") or usage
    end = time.perf_counter()
    details = usage.get("prompt_tokens_details") or {}
    turn = Turn(
        0,
        0,
        1000 * ((first or end) - start),
        1000 * (end - start),
        usage.get("prompt_tokens", 0),
        usage.get("completion_tokens", 0),
        details.get("cached_tokens"),
    )
    return turn, "".join(text)


async def converse(session, args, model: str, index: int, user_messages: list[str], turns: list[Turn]) -> None:
    history: list[dict] = []
    for number, message in enumerate(user_messages, 1):
        history.append({"role": "user", "content": message})
        turn, answer = await chat_turn(session, args, model, history)
        turn.conversation, turn.turn = index, number
        turns.append(turn)
        history.append({"role": "assistant", "content": answer})


async def served_model(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(f"{base_url}/v1/models") as response:
        return (await response.json())["data"][0]["id"]


async def run(args) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    conversations = [conversation_messages(tokenizer, args, args.seed * 1000 + i) for i in range(args.conversations)]
    turns: list[Turn] = []
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        model = args.model or await served_model(session, args.base_url)
        queue: asyncio.Queue = asyncio.Queue()
        for item in enumerate(conversations):
            queue.put_nowait(item)

        async def worker() -> None:
            while not queue.empty():
                index, messages = queue.get_nowait()
                await converse(session, args, model, index, messages, turns)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        duration = time.perf_counter() - start
    return summary(args, turns, duration)


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    return {"p50": statistics.median(ordered), "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]}


def summary(args, turns: list[Turn], duration: float) -> dict:
    later = [t for t in turns if t.turn > 1]
    cached = [t.cached_tokens for t in turns if t.cached_tokens is not None]
    return {
        "workload": {
            k: getattr(args, k)
            for k in ("conversations", "turns", "concurrency", "first_len", "question_len", "output_len", "seed")
        },
        "completed": len(turns),
        "duration_s": duration,
        "ttft_ms": percentiles([t.ttft_ms for t in turns]),
        "ttft_ms_later_turns": percentiles([t.ttft_ms for t in later]),
        "latency_ms": percentiles([t.latency_ms for t in turns]),
        "output_throughput": sum(t.completion_tokens for t in turns) / duration,
        "prompt_tokens": sum(t.prompt_tokens for t in turns),
        "cached_tokens": sum(cached) if cached else None,
        "requests": [asdict(t) for t in sorted(turns, key=lambda t: (t.conversation, t.turn))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--model", help="served model name (default: the server's first)")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--first-len", type=int, default=500)
    parser.add_argument("--question-len", type=int, default=50)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    args.result.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("completed", "ttft_ms", "ttft_ms_later_turns", "output_throughput")}))


if __name__ == "__main__":
    main()
