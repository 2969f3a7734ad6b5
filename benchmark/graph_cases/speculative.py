"""Speculative decoding (n-gram prompt lookup, draft models) against plain decoding, same artifact, one run.

Usage: ONP_BACKEND=cpu python benchmark/graph_cases/speculative.py ARTIFACT OUT_DIR [--k K] [--draft NAME=DIR ...]
    [--modes plain,ngram,NAME] [--workloads copy,random,nohit] [--vllm-cpu HF_DIR]
The artifact must be exported with --speculative-tokens K. In-process vllm.LLM engines of the same artifact run one
after the other: without speculation (plain), with --speculative-config '{"method": "ngram",
"num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}' (ngram), and with
'{"method": "draft_model", "model": DIR, "num_speculative_tokens": K}' for each --draft NAME=DIR, on workloads at
concurrency 1 (one request at a time) and 4 (four requests per generate call), --prompts prompts each:
- copy: chat prompts asking to repeat a paragraph with its typos fixed (the answer copies most of the prompt), greedy;
- random: random token prompts (no text for a lookup to copy), greedy;
- nohit: open chat questions whose answers do not quote them, sampled (temperature 0.8, top_p 0.95, seeded): the
  answers neither copy the prompt nor fall into greedy loops, so n-gram drafts rarely exist or hit.
With --vllm-cpu HF_DIR (the Hugging Face directory the artifact was exported from), vLLM's own CPU backend then
serves the same weights, workloads and n-gram config, plain and ngram, each in a child process of this script
(ONP_BACKEND=off, float32, --max-model-len and --max-num-seqs of the artifact, VLLM_CPU_KVCACHE_SPACE=2,
VLLM_CPU_OMP_THREADS_BIND=0-<cores - 1> unless set); a mode that fails to start or run is recorded with the last
lines it printed.
Writes results.json (output tokens, seconds, tok/s, vLLM's spec-decode counters) and results.md (ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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


def request_params(workload: str, count: int, max_tokens: int) -> list:
    from vllm import SamplingParams

    if workload == "nohit":
        return [SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95, seed=i) for i in range(count)]
    return [SamplingParams(max_tokens=max_tokens, temperature=0.0)] * count


def run(llm, workload: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    params = request_params(workload, len(prompts), max_tokens)
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


def ngram_spec(k: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def vllm_cpu_results(args: argparse.Namespace) -> dict:
    """Runs this script on vLLM's own CPU backend (plugin off) for plain and ngram, one child process each."""
    shape = json.loads((Path(args.artifact) / "neuron_config.json").read_text())
    env = {
        **os.environ,
        "ONP_BACKEND": "off",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", f"0-{os.cpu_count() - 1}"),
    }
    results = {}
    for mode in ("plain", "ngram"):
        out = args.out_dir / f"vllm-cpu-{mode}"
        command = [sys.executable, __file__, args.vllm_cpu, str(out), "--engine", "vllm-cpu", "--modes", mode]
        command += ["--k", str(args.k), "--prompts", str(args.prompts), "--workloads", args.workloads]
        command += ["--output-tokens", str(args.output_tokens)]
        command += ["--max-model-len", str(shape["sequence_length"]), "--max-num-seqs", str(shape["batch_size"])]
        print("vllm-cpu", mode, " ".join(command), flush=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        (args.out_dir / f"vllm-cpu-{mode}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            tail = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-15:]
            results[f"vllm-cpu-{mode}/error"] = {"returncode": done.returncode, "tail": tail}
            print("vllm-cpu", mode, "failed:", *tail, sep="\n", flush=True)
            continue
        child = json.loads((out / "results.json").read_text())
        results.update({f"vllm-cpu-{key}": value for key, value in child.items()})
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per workload (at most 8)")
    parser.add_argument("--output-tokens", type=int, default=64, help="tokens per answer")
    parser.add_argument("--draft", action="append", default=[], help="NAME=DIR: a draft model export to compare")
    parser.add_argument("--modes", default=None, help="comma-separated: plain, ngram, draft names (default: all)")
    parser.add_argument("--workloads", default="copy,random", help="comma-separated: copy, random, nohit")
    parser.add_argument("--vllm-cpu", default=None, help="HF_DIR: also run vLLM's CPU backend on these weights")
    parser.add_argument("--engine", default="ours", choices=("ours", "vllm-cpu"), help=argparse.SUPPRESS)
    parser.add_argument("--max-model-len", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--max-num-seqs", type=int, default=None, help=argparse.SUPPRESS)
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
    specs = {"plain": None, "ngram": ngram_spec(args.k)}
    for name, directory in (d.split("=", 1) for d in args.draft):
        specs[name] = {"method": "draft_model", "model": directory, "num_speculative_tokens": args.k}
    modes = args.modes.split(",") if args.modes else list(specs)
    results = {}
    for mode in modes:
        shape = {}
        if args.engine == "vllm-cpu":
            shape = {"dtype": "float32", "max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs}
        llm = LLM(model=args.artifact, seed=0, speculative_config=specs[mode], disable_log_stats=False, **shape)
        run(llm, "copy", copy_prompts(tokenizer)[:1], 1, args.output_tokens)  # warm-up
        for workload, prompts in workloads.items():
            for concurrency in (1, 4):
                results[f"{mode}/{workload}/c{concurrency}"] = run(
                    llm, workload, prompts, concurrency, args.output_tokens
                )
                print(mode, workload, concurrency, results[f"{mode}/{workload}/c{concurrency}"], flush=True)
        llm.llm_engine.engine_core.shutdown()
        del llm
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.vllm_cpu:
        results.update(vllm_cpu_results(args))
    (args.out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if args.engine == "vllm-cpu":
        return
    text = summary(results, args.k, [m for m in modes if m != "plain"], list(workloads))
    if args.vllm_cpu:
        text += "\n" + peer_summary(results, list(workloads))
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


def acceptance(result: dict) -> str:
    drafted, accepted = result.get("num_draft_tokens", 0), result.get("num_accepted_tokens", 0)
    return f"{accepted / drafted:.2f}" if drafted else "-"


def peer_summary(results: dict, workloads: list[str]) -> str:
    """Ours and vLLM's CPU backend, plain and ngram: tok/s, the three ratios and each ngram's acceptance."""
    lines = [
        "| workload | concurrency | ours plain | ours ngram | vLLM CPU plain | vLLM CPU ngram | ours ngram/plain "
        "| vLLM CPU ngram/plain | ours ngram/vLLM CPU ngram | acceptance ours | acceptance vLLM CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for workload, concurrency in ((w, c) for w in workloads for c in (1, 4)):
        keys = ("plain", "ngram", "vllm-cpu-plain", "vllm-cpu-ngram")
        runs = [results.get(f"{key}/{workload}/c{concurrency}") for key in keys]
        speeds = [f"{r['tok_per_s']:.1f}" if r else "failed" for r in runs]

        def ratio(a: dict | None, b: dict | None) -> str:
            return f"{a['tok_per_s'] / b['tok_per_s']:.2f}x" if a and b else "-"

        ratios = [ratio(runs[1], runs[0]), ratio(runs[3], runs[2]), ratio(runs[1], runs[3])]
        rates = [acceptance(r) if r else "-" for r in (runs[1], runs[3])]
        lines.append(f"| {workload} | {concurrency} | " + " | ".join(speeds + ratios + rates) + " |")
    errors = {key: value for key, value in results.items() if key.endswith("/error")}
    for key, error in errors.items():
        lines += [
            "",
            f"{key.removesuffix('/error')} failed (exit {error['returncode']}):",
            "```",
            *error["tail"],
            "```",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
