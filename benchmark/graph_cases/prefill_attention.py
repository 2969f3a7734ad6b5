"""Chunked prefill with the chunk attention op's CPU kernel against its masked form and HF eager's forward: one
process, one artifact, the sides alternated per prompt length and round, ratios printed.

    .venv/bin/python benchmark/graph_cases/prefill_attention.py [--model M.gguf] [--sequence-length 8192] [--chunk 128]
        [--lengths 2048,4096,8192] [--rounds 2] [--threads 2] [--out benchmark/results/NAME]

The artifact (batch 1, exported once under benchmark/results/artifacts/) calls the op `onp::chunk_attention` in
every prompt-chunk graph. "kernel" runs it on its CPU kernel (backends/cpu_attention.py: each row's prior up to its
start, no mask); "masked" registers the op's masked definition as its CPU kernel instead (models/attention.py:
the whole prior bucket under the chunk's bias, what the graphs computed before the op): the same programs, the
same replays, only the attention differs. "hf" is HF transformers' eager forward of the same tokens (logits of the
last position only). A prefill is the graph calls up to the first token's logits (TTFT without the server).
Writes prefill_attention.json and prefill_attention.md into --out.

With --layer, one layer of SmolLM2's attention instead (9 heads over 3 KV heads, head_dim 64, random values): each
chunk of a --lengths prompt through the kernel and the masked definition (prior bucket: the default prefill ladder),
best of 3 per chunk with the forms alternated chunk by chunk, summed, against HF's causal SDPA of the whole prompt.
Writes layer.json and layer.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import call_seconds

ROOT = Path(__file__).resolve().parent
ARTIFACTS = ROOT / "results" / "artifacts"
sys.path.insert(0, str(ROOT))


def export(model: Path, out: Path, sequence_length: int, chunk: int) -> None:
    if (out / "neuron_config.json").is_file():
        return
    subprocess.run(
        [sys.executable, "-m", "exporter", "--model", str(model), "--batch-size", "1", "--sequence-length",
         str(sequence_length), "--prefill-chunk-size", str(chunk), "--backend", "cpu", "--overwrite", str(out)],
        check=True,
    )  # fmt: skip


def layer_main(args) -> None:
    import torch.nn.functional as F

    from optimum_neuron_plugin.backends.cpu_attention import chunk_attention_cpu
    from optimum_neuron_plugin.config import default_prefill_buckets
    from optimum_neuron_plugin.models.attention import masked_chunk_attention
    from optimum_neuron_plugin.models.masks import chunk_bias

    heads, kv_heads, dim, t = 9, 3, 64, args.chunk
    buckets = default_prefill_buckets(args.sequence_length, t)
    cache = [torch.randn(1, kv_heads, args.sequence_length, dim) for _ in range(2)]
    seq_ids = torch.zeros(1, dtype=torch.int64)

    def best(fn) -> float:
        return min(call_seconds(fn, 3))

    rows = []
    for n in [int(x) for x in args.lengths.split(",")]:
        seconds = {"kernel": 0.0, "masked": 0.0}
        for start in range(0, n, t):
            prior = next(b for b in buckets if b >= start)
            positions = torch.arange(start, start + t, dtype=torch.int32)[None]
            bias = chunk_bias(positions, prior, heads // kv_heads, torch.float32)
            q, k, v = torch.randn(1, t, heads, dim), torch.randn(1, t, kv_heads, dim), torch.randn(1, t, kv_heads, dim)
            inputs = (q, k, v, *cache, seq_ids, positions, bias, 0, None, None)
            for name, form in (("kernel", chunk_attention_cpu), ("masked", masked_chunk_attention)):
                seconds[name] += best(lambda form=form, inputs=inputs: form(*inputs))
        q = torch.randn(1, heads, n, dim)
        seconds["hf causal sdpa"] = best(lambda q=q: F.scaled_dot_product_attention(q, q, q, is_causal=True))
        rows.append({"prompt_tokens": n, "seconds_per_layer": seconds})
        print(f"[prefill_attention] layer {n}: {seconds}", flush=True)
    lines = [f"Attention of one layer (SmolLM2 shapes), chunk {t}, {args.threads} threads, best of 3 per chunk", ""]
    lines += ["| prompt | kernel s | masked s | HF causal SDPA s | kernel / masked | kernel / HF | masked / HF |"]
    lines += ["|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = r["seconds_per_layer"]
        k, m, h = s["kernel"], s["masked"], s["hf causal sdpa"]
        lines.append(
            f"| {r['prompt_tokens']} | {k:.3f} | {m:.3f} | {h:.3f} | {k / m:.2f} | {k / h:.2f} | {m / h:.2f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "layer.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.out / "layer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    from common import default_model, hf_model, prompt_ids

    from optimum_neuron_plugin import NeuronModelForCausalLM
    from optimum_neuron_plugin.backends import cpu_attention  # noqa: F401 - the op's CPU kernel
    from optimum_neuron_plugin.models.attention import masked_chunk_attention

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--sequence-length", type=int, default=8192)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    parser.add_argument("--layer", action="store_true", help="one layer's attention: kernel vs masked vs HF")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.layer:
        return layer_main(args)
    model_path = args.model or default_model()
    artifact = ARTIFACTS / f"prefill-attention-s{args.sequence_length}-c{args.chunk}"
    export(model_path, artifact, args.sequence_length, args.chunk)
    model = NeuronModelForCausalLM.from_pretrained(artifact)
    hf = hf_model(model_path)

    def prefill(side: str, tokens: list[int]) -> float:
        start = time.perf_counter()
        if side == "hf":
            with torch.inference_mode():
                hf(torch.tensor([tokens]), use_cache=True, logits_to_keep=1)
        elif side == "kernel":
            model.prefill(0, tokens)
        else:  # the masked definition as the op's CPU kernel, over the C++ one, for this call
            masked = torch.library.Library("onp", "IMPL")
            masked.impl("chunk_attention", masked_chunk_attention, "CPU")
            try:
                model.prefill(0, tokens)
            finally:
                masked._destroy()
        return time.perf_counter() - start

    lengths = [int(x) for x in args.lengths.split(",")]
    warm = prompt_ids(max(lengths), model.config.vocab_size)
    prefill("kernel", warm)  # every prefill graph's first call (traced) before any timing
    sides = ["kernel", "masked", "hf"]
    times: dict[int, dict[str, list[float]]] = {n: {s: [] for s in sides} for n in lengths}
    for round_ in range(args.rounds):
        for n in lengths:
            tokens = warm[:n]
            for side in sides if round_ % 2 == 0 else sides[::-1]:
                times[n][side].append(prefill(side, tokens))
                print(f"[prefill_attention] round {round_} {n} tokens {side}: {times[n][side][-1]:.2f} s", flush=True)
    rows = []
    for n in lengths:
        best = {side: min(times[n][side]) for side in sides}
        rows.append({"prompt_tokens": n, "seconds": best, "all_seconds": times[n],
                     "kernel_over_masked": best["kernel"] / best["masked"],
                     "kernel_over_hf": best["kernel"] / best["hf"], "masked_over_hf": best["masked"] / best["hf"]})  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill_attention.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        f"Chunked prefill, {model_path.name}, sequence_length {args.sequence_length}, chunk {args.chunk}, batch 1, "
        f"{args.threads} threads, best of {args.rounds} (sides alternated)",
        "",
        "| prompt | kernel s | masked s | HF eager s | kernel / masked | kernel / HF | masked / HF |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        s = r["seconds"]
        lines.append(
            f"| {r['prompt_tokens']} | {s['kernel']:.2f} | {s['masked']:.2f} | {s['hf']:.2f} | "
            f"{r['kernel_over_masked']:.2f} | {r['kernel_over_hf']:.2f} | {r['masked_over_hf']:.2f} |"
        )
    (args.out / "prefill_attention.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
