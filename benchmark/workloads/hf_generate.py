"""Peer: HF transformers `generate`, batched, on the prompts `vllm bench serve` sends.

    .venv/bin/python benchmark/workloads/hf_generate.py --model HF_DIR --concurrency 4 --out RESULT.json \
        -- --dataset-name random --random-input-len 384 --random-output-len 48 --num-prompts 16 --seed 0 \
           --tokenizer DIR

The options after `--` are vllm bench serve's own: its dataset code samples the prompts, so they are
the very prompts the servers get. Prompts run in static batches of `--concurrency` (left padded,
greedy unless --temperature is given, exactly output-len new tokens each). Per batch, a
stopping-criteria hook timestamps every decoding step: TTFT is the time to the first step, ITL the
gaps between steps, end-to-end latency the batch's time. The result JSON has vllm bench's keys (request_throughput, output_throughput,
p50_ttft_ms, p99_itl_ms, ...), so collect.py reads it like the others.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime

import numpy as np


def sample_prompts(bench_args: list[str]):
    from vllm.benchmarks.datasets import get_samples
    from vllm.benchmarks.serve import add_cli_args
    from vllm.tokenizers import get_tokenizer
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(bench_args)
    tokenizer = get_tokenizer(args.tokenizer)
    return get_samples(args, tokenizer), args


class StepClock:
    """A stopping criterion that never stops: it records when each decoding step ends."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def percentiles(values: list[float], name: str, out: dict) -> None:
    data = np.asarray(values or [0.0]) * 1000
    out[f"mean_{name}_ms"] = float(np.mean(data))
    out[f"median_{name}_ms"] = float(np.median(data))
    out[f"std_{name}_ms"] = float(np.std(data))
    for p in (50, 99):
        out[f"p{p}_{name}_ms"] = float(np.percentile(data, p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--concurrency", type=int, required=True, help="batch size of generate")
    parser.add_argument("--num-warmups", type=int, default=1, help="warm-up batches (not measured)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", required=True)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then vllm bench serve's dataset options")
    args = parser.parse_args()
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteriaList

    torch.set_num_threads(args.threads)
    requests, bench = sample_prompts(bench_args)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    output_len = bench.random_output_len
    temperature = bench.temperature or 0.0

    def run(batch) -> tuple[float, StepClock, int]:
        inputs = tokenizer([r.prompt for r in batch], return_tensors="pt", padding=True)
        clock = StepClock()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                max_new_tokens=output_len,
                min_new_tokens=output_len,
                do_sample=bool(temperature),
                temperature=temperature or None,
                pad_token_id=tokenizer.pad_token_id,
                stopping_criteria=StoppingCriteriaList([clock]),
            )
        generated = int(out.shape[1] - inputs["input_ids"].shape[1])
        return start, clock, generated

    batches = [requests[i : i + args.concurrency] for i in range(0, len(requests), args.concurrency)]
    for _ in range(args.num_warmups):
        run(batches[0])

    ttfts, itls, tpots, latencies, output_lens = [], [], [], [], []
    began = time.perf_counter()
    for number, batch in enumerate(batches, 1):
        start, clock, generated = run(batch)
        end = clock.times[-1]
        gaps = list(np.diff(clock.times))
        for _ in batch:
            ttfts.append(clock.times[0] - start)
            itls.extend(gaps)
            tpots.append((end - clock.times[0]) / max(generated - 1, 1))
            latencies.append(end - start)
            output_lens.append(generated)
        print(f"[hf-generate] batch {number}/{len(batches)}: {end - start:.2f} s", file=sys.stderr, flush=True)
    duration = time.perf_counter() - began

    result = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "hf-generate",
        "model_id": args.model,
        "num_prompts": len(requests),
        "max_concurrency": args.concurrency,
        "duration": duration,
        "completed": len(requests),
        "failed": 0,
        "total_input_tokens": int(sum(r.prompt_len for r in requests)),
        "total_output_tokens": int(sum(output_lens)),
        "request_throughput": len(requests) / duration,
        "output_throughput": sum(output_lens) / duration,
        "latencies": latencies,
        "metadata": {"config": "hf-generate", "concurrency": args.concurrency, "threads": args.threads},
    }
    percentiles(ttfts, "ttft", result)
    percentiles(tpots, "tpot", result)
    percentiles(itls, "itl", result)
    percentiles(latencies, "e2el", result)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(
        f"[hf-generate] concurrency {args.concurrency}: {result['request_throughput']:.2f} req/s, "
        f"{result['output_throughput']:.1f} tok/s, TTFT p50 {result['p50_ttft_ms']:.0f} ms, "
        f"ITL p50 {result['p50_itl_ms']:.1f} ms",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
