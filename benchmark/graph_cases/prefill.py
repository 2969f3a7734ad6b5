"""Chunked vs context-encoding prefill vs HF transformers: time and peak memory for long prompts, as
ratios in one run.

    .venv/bin/python benchmark/graph_cases/prefill.py [--sequence-length 4096] [--chunk 512] [--lengths 2048,4096]
        [--prefill-batch-size 1] [--prefill-tail-size 0] [--no-context-encoding] [--out DIR]
    .venv/bin/python benchmark/graph_cases/prefill.py --profile 8192 [--sequence-length 8192] [--out DIR]

Exports the model twice (chunked and context_encoding, cached under benchmark/results/artifacts/; with
--no-context-encoding only the chunked one: a context-encoding graph of 8k tokens needs several GB),
then measures each (artifact, prompt length) in a fresh process: best-of-N prefill time (the graph
calls up to the first token's logits: TTFT without the server) and the peak resident memory added by
the prefill; HF's eager forward of the same tokens (logits of the last position only) is measured the
same way. Writes prefill.json and prefill.md into --out.

--profile LENGTH instead profiles one prefill of LENGTH tokens, chunked (the exported graphs) and HF eager, each
in a fresh process under torch.profiler, and writes profile.json and profile.md: self CPU seconds per kind of
op (attention kernel, matmuls, copies and gathers, elementwise/norms, the rest), so the ratio to HF splits into
where it comes from.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from common import ARTIFACTS, add_out, default_model, hf_model, prompt_ids, slug

HF = "hf:"  # a measurement target naming the model HF eager runs, not an artifact


def export(model: str, out: Path, sequence_length: int, chunk: int, prefill_batch: int = 1, tail: int = 0) -> None:
    """A batch of prefill_batch slots (1 for a context-encoding export), its chunks prefilled prefill_batch at a time
    and a last piece of at most `tail` tokens on the tail graph: the served artifact's shape."""
    if (out / "neuron_config.json").is_file():
        return
    print(f"[prefill] exporting {out.name}", flush=True)
    batched = ["--prefill-batch-size", str(prefill_batch), "--prefill-tail-size", str(tail)] if chunk else []
    subprocess.run(
        [sys.executable, "-m", "exporter", "--model", model, "--batch-size", str(prefill_batch if chunk else 1),
         "--sequence-length", str(sequence_length), "--prefill-chunk-size", str(chunk), *batched, "--backend", "cpu",
         "--overwrite", str(out)],
        check=True,
    )  # fmt: skip


def measure(directory: str, length: int, repeats: int) -> dict:
    from optimum_neuron_plugin import NeuronModelForCausalLM

    model = NeuronModelForCausalLM.from_pretrained(directory)
    tokens = prompt_ids(length, model.args.vocab_size)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.prefill(0, tokens)
        times.append(time.perf_counter() - start)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "graph": model.neuron_config.prefill_graph,
        "chunk": model.neuron_config.prefill_chunk_size,
        "prompt_tokens": length,
        "graph_calls": model.prefill_calls(length),
        "seconds": min(times),
        "peak_rss_added_mb": (rss_after - rss_before) / 1024,
    }


def measure_hf(gguf: str, length: int, repeats: int) -> dict:
    import torch

    model = hf_model(Path(gguf))
    tokens = torch.tensor([prompt_ids(length, model.config.vocab_size)])
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.inference_mode():
            model(tokens, use_cache=True, logits_to_keep=1)
        times.append(time.perf_counter() - start)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": min(times), "peak_rss_added_mb": (rss_after - rss_before) / 1024}


OP_KINDS = {
    "attention": ("scaled_dot_product", "flash_attention", "onp::chunk_attention", "onp::decode_attention"),
    "matmul": ("linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "cpu_linear", "_weight_int"),
    "copy / gather / cat": ("copy_", "index", "cat", "gather", "clone", "contiguous", "select", "slice"),
    "norm / rope / activation / elementwise": ("mul", "add", "silu", "rsqrt", "pow", "mean", "neg", "sub", "div",
                                               "cos", "sin", "where", "softmax", "to", "exp", "onp::rms_norm",
                                               "onp::rope", "onp::gated_activation", "fill", "masked_fill"),
}  # fmt: skip


def op_kind(name: str) -> str:
    return next((kind for kind, keys in OP_KINDS.items() if any(key in name for key in keys)), "other")


def profile(target: str, length: int) -> dict:
    """Self CPU seconds per op kind of one prefill (after one warm-up prefill), and the wall seconds."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    if target.startswith(HF):
        model = hf_model(Path(target.removeprefix(HF)))
        ids = torch.tensor([prompt_ids(length, model.config.vocab_size)])

        def run() -> None:
            with torch.inference_mode():
                model(ids, use_cache=True, logits_to_keep=1)
    else:
        from optimum_neuron_plugin import NeuronModelForCausalLM

        model = NeuronModelForCausalLM.from_pretrained(target)
        tokens = prompt_ids(length, model.args.vocab_size)

        def run() -> None:
            model.prefill(0, tokens)

    run()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
    kinds: dict[str, float] = {}
    ops: dict[str, float] = {}
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        kinds[op_kind(event.key)] = kinds.get(op_kind(event.key), 0.0) + seconds
        ops[event.key] = seconds
    top = dict(sorted(ops.items(), key=lambda item: -item[1])[:12])
    return {"wall_seconds": wall, "self_seconds_by_kind": kinds, "top_ops": top}


def run_profile(model: str, chunked: Path, length: int, out: Path) -> None:
    figures = {}
    for name, target in {"chunked": str(chunked), "hf": HF + model}.items():
        print(f"[prefill] profiling {name}: {length}-token prompt", flush=True)
        cmd = [sys.executable, __file__, "--profile-one", target, str(length)]
        figures[name] = json.loads(
            subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(figures, indent=2) + "\n")
    chunked_kinds, hf_kinds = figures["chunked"]["self_seconds_by_kind"], figures["hf"]["self_seconds_by_kind"]
    lines = [
        f"Prefill of {length} tokens under torch.profiler, {Path(model).name}, chunk {chunked.name} (CPU backend):"
        " self CPU seconds per op kind",
        "",
        "| op kind | chunked s | HF eager s | chunked / HF |",
        "|---|---:|---:|---:|",
    ]
    for kind in [*OP_KINDS, "other"]:
        c, h = chunked_kinds.get(kind, 0.0), hf_kinds.get(kind, 0.0)
        lines.append(f"| {kind} | {c:.2f} | {h:.2f} | {c / h if h else float('nan'):.2f} |")
    c_wall, h_wall = figures["chunked"]["wall_seconds"], figures["hf"]["wall_seconds"]
    lines.append(f"| wall (profiled) | {c_wall:.2f} | {h_wall:.2f} | {c_wall / h_wall:.2f} |")
    for name in figures:
        lines += ["", f"Top ops, {name}:", ""]
        lines += [f"- `{op}`: {seconds:.2f} s" for op, seconds in figures[name]["top_ops"].items()]
    (out / "profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def run_measure(target: str, length: int, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--measure", target, str(length), "--repeats", str(repeats)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.environ.get("MODEL"))
    parser.add_argument("--sequence-length", type=int, default=int(os.environ.get("SEQUENCE_LENGTH", 4096)))
    parser.add_argument("--chunk", type=int, default=int(os.environ.get("CHUNK_SIZE", 512)))
    parser.add_argument("--lengths", default=os.environ.get("PROMPT_LENGTHS", "2048,4096"))
    parser.add_argument("--prefill-batch-size", type=int, default=1, help="chunks per prefill call (and batch size)")
    parser.add_argument("--prefill-tail-size", type=int, default=0, help="tail graphs of this many tokens (0: none)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-context-encoding", action="store_true", help="measure chunked and HF only")
    parser.add_argument("--profile", type=int, metavar="LENGTH", help="profile one prefill of LENGTH tokens")
    parser.add_argument("--measure", nargs=2, metavar=("DIR", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--profile-one", nargs=2, metavar=("TARGET", "LENGTH"), help=argparse.SUPPRESS)
    add_out(parser, "long-prefill-vs-hf-eager")
    args = parser.parse_args()
    if args.profile_one:
        print(json.dumps(profile(args.profile_one[0], int(args.profile_one[1]))))
        return
    if args.measure:
        target, length = args.measure[0], int(args.measure[1])
        figures = measure_hf(target.removeprefix(HF), length, args.repeats) if target.startswith(HF) else None
        print(json.dumps(figures or measure(target, length, args.repeats)))
        return
    model = str(args.model or default_model())
    name = f"prefill-{slug(Path(model))}-s{args.sequence_length}"
    batched = (
        f"-p{args.prefill_batch_size}-t{args.prefill_tail_size}"
        if args.prefill_batch_size > 1 or args.prefill_tail_size
        else ""
    )
    chunked, full = ARTIFACTS / f"{name}-c{args.chunk}{batched}", ARTIFACTS / f"{name}-c0"
    export(model, chunked, args.sequence_length, args.chunk, args.prefill_batch_size, args.prefill_tail_size)
    if args.profile:
        run_profile(model, chunked, args.profile, args.out)
        return
    targets = {"chunked": chunked, "context_encoding": full, "hf": HF + model}
    if args.no_context_encoding:
        del targets["context_encoding"]
    else:
        export(model, full, args.sequence_length, 0)
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        pair = {"context_encoding": {"seconds": float("nan"), "peak_rss_added_mb": float("nan")}}
        for name, target in targets.items():
            print(f"[prefill] {name}: {length}-token prompt", flush=True)
            pair[name] = run_measure(str(target), length, args.repeats)
        rows.append(
            {
                "prompt_tokens": length,
                "chunked": pair["chunked"],
                "context_encoding": pair["context_encoding"],
                "hf": pair["hf"],
                "time_ratio_chunked_over_ce": pair["chunked"]["seconds"] / pair["context_encoding"]["seconds"],
                "time_ratio_chunked_over_hf": pair["chunked"]["seconds"] / pair["hf"]["seconds"],
                "memory_ratio_chunked_over_ce": pair["chunked"]["peak_rss_added_mb"]
                / max(pair["context_encoding"]["peak_rss_added_mb"], 1e-6),
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        f"Prefill, {Path(model).name}, sequence_length {args.sequence_length}, chunk {args.chunk} (CPU backend)",
        "",
        "| prompt | chunked s (calls) | context-encoding s | HF eager s | chunked / CE | chunked / HF "
        "| chunked peak MB | CE peak MB | HF peak MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        c, f, h = r["chunked"], r["context_encoding"], r["hf"]
        lines.append(
            f"| {r['prompt_tokens']} | {c['seconds']:.2f} ({c['graph_calls']}) | {f['seconds']:.2f} | {h['seconds']:.2f} "
            f"| {r['time_ratio_chunked_over_ce']:.2f} | {r['time_ratio_chunked_over_hf']:.2f} "
            f"| {c['peak_rss_added_mb']:.0f} | {f['peak_rss_added_mb']:.0f} | {h['peak_rss_added_mb']:.0f} |"
        )
    (args.out / "prefill.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
