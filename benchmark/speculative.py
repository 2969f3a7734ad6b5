"""Speculative decoding (n-gram prompt lookup, draft models) against plain decoding, same artifact, one run.

Usage: ONP_BACKEND=cpu python benchmark/speculative.py ARTIFACT OUT_DIR [--k K] [--draft NAME=DIR ...]
    [--modes plain,ngram,NAME] [--workloads copy,random,nohit]
The artifact must be exported with --speculative-tokens K. In-process vllm.LLM engines of the same artifact run one
after the other: without speculation (plain), with --speculative-config '{"method": "ngram",
"num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}' (ngram), and with
'{"method": "draft_model", "model": DIR, "num_speculative_tokens": K}' for each --draft NAME=DIR, on workloads at
concurrency 1 (one request at a time) and 4 (four requests per generate call), --prompts prompts each:
- copy: chat prompts asking to repeat a paragraph with its typos fixed (the answer copies most of the prompt), greedy;
- random: random token prompts (no text for a lookup to copy), greedy;
- nohit: open chat questions whose answers do not quote them, sampled (temperature 0.8, top_p 0.95, seeded): the
  answers neither copy the prompt nor fall into greedy loops, so n-gram drafts rarely exist or hit.
Writes results.json (output tokens, seconds, tok/s, vLLM's spec-decode counters) and results.md (ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("ONP_BACKEND", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog near the river bank, whlie the farmer watches from his porch and "
    "wonders whether the rain will come before the harvest is finished this year.",
    "Our team meets every Monday at nine to review the progress of the project, discuss the blockers that came up "
    "during the week and agree on the priorties for the next sprint.",
    "To install the package, download the archive, extract it into a folder of your choice and run the setup "
    "script; the installer will ask for the destination directory and create a shortcut on the desktp.",
    "The museum opens at ten in the morning and closes at six in the evening; tickets can be bought online or at "
    "the entrance, and children under twelve visit for free on weekends and public holidyas.",
    "Please remember to water the plants twice a week, feed the cat in the morning and the evening, and take the "
    "recycling out on Thursday night so that it is collected early on Friday mornnig.",
    "The report shows that sales grew by twelve percent in the third quarter, mainly driven by the new product "
    "line, while costs stayed flat thanks to the savings made in logistics and supplys.",
    "When the train arrived at the station, the passengers hurried to the exit, carrying their bags and looking "
    "for the taxis that usually wait in front of the main entrance of the buiding.",
    "The recipe needs two cups of flour, one cup of sugar, three eggs, a pinch of salt and half a cup of melted "
    "butter; mix everything well and bake it for thirty minutes in a hot oevn.",
]
QUESTIONS = [
    "Write a short poem about autumn leaves.",
    "Give me three ideas for a birthday party for a seven year old.",
    "What are the benefits of learning a second language?",
    "Describe a sunset over the ocean to someone who has never seen one.",
    "Suggest a name for a bakery and explain why.",
    "How should I prepare for a job interview?",
    "Tell me a short story about a robot who learns to paint.",
    "What should I pack for a weekend hiking trip?",
]
MAX_TOKENS = 64


def copy_prompts(tokenizer) -> list[list[int]]:
    prompts = []
    for text in PARAGRAPHS:
        messages = [{"role": "user", "content": f"Fix the typos in this paragraph and repeat it:\n\n{text}"}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False).input_ids)
    return prompts


def chat_prompts(tokenizer, questions: list[str]) -> list[list[int]]:
    messages = [[{"role": "user", "content": q}] for q in questions]
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    return [tokenizer(text, add_special_tokens=False).input_ids for text in texts]


def random_prompts(vocab: int, count: int, length: int = 128) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(0)
    return [torch.randint(100, vocab - 100, (length,), generator=generator).tolist() for _ in range(count)]


def spec_counters(llm) -> dict[str, int]:
    return {
        m.name.removeprefix("vllm:spec_decode_"): m.value
        for m in llm.get_metrics()
        if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")
    }


def request_params(workload: str, count: int) -> list:
    from vllm import SamplingParams

    if workload == "nohit":
        return [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.95, seed=i) for i in range(count)]
    return [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)] * count


def run(llm, workload: str, prompts: list[list[int]], concurrency: int) -> dict:
    params = request_params(workload, len(prompts))
    before = spec_counters(llm)
    began, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), concurrency):
        batch = [{"prompt_token_ids": p} for p in prompts[i : i + concurrency]]
        outputs = llm.generate(batch, params[i : i + concurrency], use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in outputs)
    seconds = time.perf_counter() - began
    after = spec_counters(llm)
    counters = {name: after[name] - before.get(name, 0) for name in after}
    return {"output_tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds, **counters}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per workload (at most 8)")
    parser.add_argument("--draft", action="append", default=[], help="NAME=DIR: a draft model export to compare")
    parser.add_argument("--modes", default=None, help="comma-separated: plain, ngram, draft names (default: all)")
    parser.add_argument("--workloads", default="copy,random", help="comma-separated: copy, random, nohit")
    args = parser.parse_args()
    from transformers import AutoTokenizer
    from vllm import LLM

    tokenizer = AutoTokenizer.from_pretrained(args.artifact)
    count = args.prompts
    every = {
        "copy": lambda: copy_prompts(tokenizer)[:count],
        "random": lambda: random_prompts(len(tokenizer), count),
        "nohit": lambda: chat_prompts(tokenizer, QUESTIONS[:count]),
    }
    workloads = {name: every[name]() for name in args.workloads.split(",")}
    specs = {
        "plain": None,
        "ngram": {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    }
    for name, directory in (d.split("=", 1) for d in args.draft):
        specs[name] = {"method": "draft_model", "model": directory, "num_speculative_tokens": args.k}
    modes = args.modes.split(",") if args.modes else list(specs)
    results = {}
    for mode in modes:
        llm = LLM(model=args.artifact, seed=0, speculative_config=specs[mode], disable_log_stats=False)
        run(llm, "copy", copy_prompts(tokenizer)[:1], 1)  # warm-up
        for workload, prompts in workloads.items():
            for concurrency in (1, 4):
                results[f"{mode}/{workload}/c{concurrency}"] = run(llm, workload, prompts, concurrency)
                print(mode, workload, concurrency, results[f"{mode}/{workload}/c{concurrency}"], flush=True)
        llm.llm_engine.engine_core.shutdown()
        del llm
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    text = summary(results, args.k, [m for m in modes if m != "plain"], list(workloads))
    (args.out_dir / "results.md").write_text(text)
    print(text)


def summary(results: dict, k: int, modes: list[str], workloads: list[str]) -> str:
    lines = [
        f"| workload | concurrency | speculation (k={k}) | plain tok/s | tok/s | ratio | acceptance "
        "| accepted per verify step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload, concurrency, mode in ((w, c, m) for w in workloads for c in (1, 4) for m in modes):
        plain, spec = results[f"plain/{workload}/c{concurrency}"], results[f"{mode}/{workload}/c{concurrency}"]
        drafted, accepted, drafts = (spec.get(n, 0) for n in ("num_draft_tokens", "num_accepted_tokens", "num_drafts"))
        rate = f"{accepted / drafted:.2f}" if drafted else "-"
        per_step = f"{accepted / drafts:.2f}" if drafts else "-"
        ratio = spec["tok_per_s"] / plain["tok_per_s"]
        lines.append(
            f"| {workload} | {concurrency} | {mode} | {plain['tok_per_s']:.1f} | {spec['tok_per_s']:.1f} "
            f"| {ratio:.2f}x | {rate} | {per_step} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
