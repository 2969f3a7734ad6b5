"""One prompt's prefill in one process: this plugin's chunk loop (`NeuronModelForCausalLM.prefill`) against vLLM's
own CPU backend on the same float32 weights (`LLM.generate` of one prompt, one output token, prefix caching off),
torch.compile (vLLM's default) and enforce_eager. Each engine in a fresh process, one after the other; p50 of
--repeats after a warm-up, per prompt length. With --profile, one prefill of each (ours, vLLM eager) under
torch.profiler: self CPU seconds of the top ops.

    .venv/bin/python benchmark/graph_cases/prefill_vllm.py ARTIFACT HF_DIR [--lengths 1000,530] [--modes compiled,eager]

HF_DIR is the Hugging Face directory ARTIFACT was exported from. Writes prefill_vllm.json and prefill_vllm.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import add_out, call_seconds, prompt_ids, write_json


def timed_p50(call, repeats: int) -> float:
    return statistics.median(call_seconds(call, repeats)) * 1e3


def top_ops(profiler, count: int = 8) -> dict[str, float]:
    events = sorted(profiler.key_averages(), key=lambda e: -e.self_cpu_time_total)[:count]
    return {event.key: round(event.self_cpu_time_total / 1e6, 4) for event in events}


def ours(artifact: str, lengths: list[int], repeats: int, profile: bool) -> dict:
    from optimum_neuron_plugin import NeuronModelForCausalLM

    model = NeuronModelForCausalLM.from_pretrained(artifact)

    def call_for(n: int):
        tokens = prompt_ids(n, model.args.vocab_size)
        return lambda: model.prefill(0, tokens)

    calls = {n: call_for(n) for n in lengths}
    found = {str(n): timed_p50(call, repeats) for n, call in calls.items()}
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU]) as profiler:
            calls[lengths[0]]()
        found["profile"] = top_ops(profiler)
    return found


def vllm(hf_dir: str, lengths: list[int], repeats: int, eager: bool, profile: bool, max_len: int) -> dict:
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    vocab = AutoConfig.from_pretrained(hf_dir).vocab_size
    llm = LLM(hf_dir, dtype="float32", max_model_len=max_len, max_num_seqs=4, enable_prefix_caching=False,
              enforce_eager=eager, max_num_batched_tokens=max_len)  # fmt: skip
    params = SamplingParams(max_tokens=1, temperature=0)

    def call_for(n: int):
        return lambda: llm.generate([TokensPrompt(prompt_token_ids=prompt_ids(n, vocab))], params, use_tqdm=False)

    found = {str(n): timed_p50(call_for(n), repeats) for n in lengths}
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU]) as profiler:
            call_for(lengths[0])()
        found["profile"] = top_ops(profiler)
    return found


def in_fresh_process(side: str, args: argparse.Namespace, env: dict[str, str]) -> dict:
    cmd = [sys.executable, __file__, str(args.artifact), str(args.hf_dir), "--one", side]
    cmd += ["--lengths", args.lengths, "--repeats", str(args.repeats)] + (["--profile"] if args.profile else [])
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if done.returncode != 0:
        raise SystemExit(f"{side} failed:\n{done.stderr[-3000:]}")
    # vLLM may log to stdout after the figures: the figures are the last JSON line.
    return json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("hf_dir", type=Path)
    parser.add_argument("--lengths", default="1000,530")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default="compiled,eager", help="vLLM CPU modes: compiled, eager")
    parser.add_argument("--profile", action="store_true", help="also profile one prefill of the first length")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    add_out(parser, "prefill-in-process-vs-vllm-cpu")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.one:
        if args.one == "ours":
            found = ours(str(args.artifact), lengths, args.repeats, args.profile)
        else:
            shape = json.loads((args.artifact / "neuron_config.json").read_text())
            eager = args.one == "eager"
            found = vllm(
                str(args.hf_dir), lengths, args.repeats, eager, args.profile and eager, shape["sequence_length"]
            )
        print(json.dumps(found))
        return
    vllm_env = {
        "ONP_BACKEND": "off",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", f"0-{os.cpu_count() - 1}"),
    }
    results = {}
    for mode in args.modes.split(","):
        results[f"vllm_{mode}"] = in_fresh_process(mode, args, vllm_env)
        results[f"ours_after_{mode}"] = in_fresh_process("ours", args, {"ONP_BACKEND": "cpu"})
    lines = [f"One prompt's prefill: {args.artifact.name} against vLLM CPU on {args.hf_dir.name}, p50 ms", ""]
    lines += ["| prompt | vLLM mode | vLLM ms | ours ms | ours / vLLM |", "|---:|---|---:|---:|---:|"]
    for mode in args.modes.split(","):
        for n in lengths:
            theirs, mine = results[f"vllm_{mode}"][str(n)], results[f"ours_after_{mode}"][str(n)]
            lines.append(f"| {n} | {mode} | {theirs:.0f} | {mine:.0f} | {mine / theirs:.2f} |")
    print("\n".join(lines))
    write_json(args.out, "prefill_vllm.json", results, "prefill_vllm")
    (args.out / "prefill_vllm.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
