"""Speculative decoding (n-gram prompt lookup) against plain decoding, same artifact, one run.

Usage: ONP_BACKEND=cpu python benchmark/speculative.py ARTIFACT OUT_DIR [--k K]
The artifact must be exported with --speculative-tokens K. Two in-process vllm.LLM engines of the same artifact
run one after the other, without and with --speculative-config '{"method": "ngram", "num_speculative_tokens": K,
"prompt_lookup_max": 4, "prompt_lookup_min": 2}', on two greedy workloads at concurrency 1 (one request at a time)
and 4 (four requests per generate call), --prompts prompts each:
- copy: chat prompts asking to repeat a paragraph with its typos fixed (the answer copies most of the prompt);
- random: random token prompts (no text for a lookup to copy).
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
MAX_TOKENS = 64


def copy_prompts(tokenizer) -> list[list[int]]:
    prompts = []
    for text in PARAGRAPHS:
        messages = [{"role": "user", "content": f"Fix the typos in this paragraph and repeat it:\n\n{text}"}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False).input_ids)
    return prompts


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


def run(llm, prompts: list[list[int]], concurrency: int) -> dict:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    before = spec_counters(llm)
    began, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), concurrency):
        batch = [{"prompt_token_ids": p} for p in prompts[i : i + concurrency]]
        tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(batch, params, use_tqdm=False))
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
    args = parser.parse_args()
    from transformers import AutoTokenizer
    from vllm import LLM

    tokenizer = AutoTokenizer.from_pretrained(args.artifact)
    count = args.prompts
    workloads = {"copy": copy_prompts(tokenizer)[:count], "random": random_prompts(len(tokenizer), count)}
    ngram = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    results = {}
    for mode, spec in (("plain", None), ("ngram", ngram)):
        llm = LLM(model=args.artifact, seed=0, speculative_config=spec, disable_log_stats=False)
        run(llm, workloads["copy"][:1], 1)  # warm-up
        for workload, prompts in workloads.items():
            for concurrency in (1, 4):
                results[f"{mode}/{workload}/c{concurrency}"] = run(llm, prompts, concurrency)
                print(mode, workload, concurrency, results[f"{mode}/{workload}/c{concurrency}"], flush=True)
        llm.llm_engine.engine_core.shutdown()
        del llm
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out_dir / "results.md").write_text(summary(results, args.k))
    print(summary(results, args.k))


def summary(results: dict, k: int) -> str:
    lines = [
        f"| workload | concurrency | plain tok/s | ngram k={k} tok/s | ratio | acceptance | accepted per verify step |",
        "|---|---|---|---|---|---|---|",
    ]
    for workload in ("copy", "random"):
        for concurrency in (1, 4):
            plain, spec = results[f"plain/{workload}/c{concurrency}"], results[f"ngram/{workload}/c{concurrency}"]
            drafted, accepted, drafts = (
                spec.get(n, 0) for n in ("num_draft_tokens", "num_accepted_tokens", "num_drafts")
            )
            rate = f"{accepted / drafted:.2f}" if drafted else "-"
            per_step = f"{accepted / drafts:.2f}" if drafts else "-"
            ratio = spec["tok_per_s"] / plain["tok_per_s"]
            lines.append(
                f"| {workload} | {concurrency} | {plain['tok_per_s']:.1f} | {spec['tok_per_s']:.1f} | {ratio:.2f}x "
                f"| {rate} | {per_step} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
