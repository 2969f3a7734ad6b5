"""How close a decode step and a prompt chunk run to this host's floors: the time to read the weights once at the
host's memory bandwidth (decode) and the chunk's matmul FLOPs at the host's fp32 GEMM rate (prefill).

    .venv/bin/python benchmark/results/20261128-roofline-amd/roofline.py --artifact DIR [--threads 2] [--out DIR]

- bandwidth: the best of a streaming read (sum) and a matrix-vector product over a weight-sized fp32 tensor;
- GEMM rate: torch.mm at the model's widest linear with the chunk's rows (what a chunk's linears are), and square;
- packed linears: oneDNN's inner product on prepacked weights (what the decode graphs' linears run) over every
  weight once, for 1 and batch_size rows;
- few-row kernel: the same with onp_cpu::rows_linear, which the decode graphs run;
- decode: one token_generation call of batch_size rows at --context positions (the runtime's decode, replayed),
  alternated with the same call of the artifact loaded with every linear on oneDNN;
- chunk: one chunked_prefill call of a --chunk-token prompt (the runtime's prefill, one chunk).
Writes roofline.json into --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch


def median_seconds(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def best_seconds(call, repeats: int) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - began)
    return best


def bandwidth(nbytes: int, repeats: int) -> dict:
    weights = torch.rand(nbytes // 4 // 576, 576)
    vector = torch.rand(576)
    read = best_seconds(lambda: weights.sum(), repeats)
    gemv = best_seconds(lambda: torch.mv(weights, vector), repeats)
    return {"bytes": weights.numel() * 4, "sum_gb_s": weights.numel() * 4 / read / 1e9,
            "gemv_gb_s": weights.numel() * 4 / gemv / 1e9}  # fmt: skip


def gemm_rate(rows: int, inner: int, outer: int, repeats: int) -> float:
    a, b = torch.rand(rows, inner), torch.rand(inner, outer)
    seconds = best_seconds(lambda: torch.mm(a, b), repeats)
    return 2 * rows * inner * outer / seconds / 1e9


def packed_linears_gb_s(params: dict, rows: int, repeats: int) -> float:
    """oneDNN's inner product on prepacked weights (backends/cpu_linear.py, what the decode graphs run) over every
    2-D weight of the model once (the embedding as the LM head), for `rows` input rows: bytes read per second."""
    from optimum_neuron_plugin.backends.cpu_linear import _packed_linear

    weights = [t for t in params.values() if t.dim() == 2]
    packed = [torch.ops.mkldnn._reorder_linear_weight(t.float().contiguous()) for t in weights]
    inputs = [torch.rand(rows, t.shape[1]) for t in weights]
    seconds = best_seconds(lambda: [_packed_linear(x, w, None) for x, w in zip(inputs, packed, strict=True)], repeats)
    return sum(t.numel() * 4 for t in weights) / seconds / 1e9


def rows_linears_gb_s(params: dict, rows: int, repeats: int) -> float:
    """The same for the few-row kernel the decode graphs run (onp_cpu::rows_linear on its own packing)."""
    from optimum_neuron_plugin.backends import cpu_kernels

    cpu_kernels.load()
    weights = [t for t in params.values() if t.dim() == 2]
    packed = [torch.ops.onp_cpu.pack_rows_weight(t.float().contiguous()) for t in weights]
    inputs = [torch.rand(rows, t.shape[1]) for t in weights]
    kernel = torch.ops.onp_cpu.rows_linear

    def products():
        return [kernel(x, w, None, t.shape[0]) for x, w, t in zip(inputs, packed, weights, strict=True)]

    return sum(t.numel() * 4 for t in weights) / best_seconds(products, repeats) / 1e9


def linear_flops_per_token(params: dict) -> int:
    """2 * (weights of every matmul a prompt token goes through): the linears of every layer (not the embedding,
    not the LM head, which runs for the last token only)."""
    total = 0
    for name, tensor in params.items():
        if tensor.dim() == 2 and "embed" not in name and "lm_head" not in name:
            total += tensor.numel()
    return 2 * total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from optimum_neuron_plugin import NeuronModelForCausalLM
    from optimum_neuron_plugin.backends import cpu_linear

    model = NeuronModelForCausalLM.from_pretrained(args.artifact)
    few_rows_kernel = cpu_linear.ROWS_KERNEL_MAX
    cpu_linear.ROWS_KERNEL_MAX = 0  # every linear on oneDNN's packing: the decode step before the few-row kernel
    onednn = NeuronModelForCausalLM.from_pretrained(args.artifact)
    cpu_linear.ROWS_KERNEL_MAX = few_rows_kernel
    batch, vocab = model.neuron_config.batch_size, model.args.vocab_size
    params = {name: t for name, t in model.graphs.params.items() if torch.is_tensor(t)}
    weight_bytes = sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in params.values()}.values())
    prompt = [(i * 7919) % (vocab - 10) + 5 for i in range(max(args.context, args.chunk))]
    steps = {}
    for m in (model, onednn):
        m.warm_up()
        for slot in range(batch):
            m.prefill(slot, prompt[: args.context])
        steps[id(m)] = args.context

    def decode(m) -> None:
        m.decode(list(range(batch)), [7] * batch, [steps[id(m)]] * batch)
        steps[id(m)] = args.context + (steps[id(m)] - args.context + 1) % 64

    times = {"rows": [], "onednn": []}
    decode(model), decode(onednn)
    for _ in range(args.repeats):  # alternated, so both see the same load
        for name, m in (("rows", model), ("onednn", onednn)):
            began = time.perf_counter()
            decode(m)
            times[name].append(time.perf_counter() - began)
    decode_s, decode_onednn_s = statistics.median(times["rows"]), statistics.median(times["onednn"])
    chunk_s = median_seconds(lambda: model.prefill(0, prompt[: args.chunk]), max(5, args.repeats // 4))
    memory = bandwidth(weight_bytes, 10)
    gb_s = max(memory["sum_gb_s"], memory["gemv_gb_s"])
    widest = max((t for t in params.values() if t.dim() == 2 and t.shape[0] < vocab), key=lambda t: t.numel())
    rate_chunk = gemm_rate(args.chunk, widest.shape[1], widest.shape[0], 10)
    rate_square = gemm_rate(1024, 1024, 1024, 5)
    linears = {f"packed_linears_gb_s_{rows}_rows": packed_linears_gb_s(params, rows, 10) for rows in (1, batch)}
    linears |= {f"rows_linears_gb_s_{rows}_rows": rows_linears_gb_s(params, rows, 10) for rows in (1, batch)}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    flops = linear_flops_per_token(params) * args.chunk
    result = {
        "commit": commit, "threads": args.threads, "artifact": str(args.artifact), "weight_bytes": weight_bytes,
        **memory, "decode_ms": decode_s * 1e3, "decode_onednn_linears_ms": decode_onednn_s * 1e3, "decode_floor_ms": weight_bytes / gb_s / 1e6,
        "decode_over_floor": decode_s / (weight_bytes / gb_s / 1e9), **linears,
        "gemm_gflop_s_chunk_rows": rate_chunk, "gemm_gflop_s_1024": rate_square, "widest_linear": list(widest.shape),
        "chunk_tokens": args.chunk, "chunk_ms": chunk_s * 1e3, "chunk_linear_gflop": flops / 1e9,
        "chunk_floor_ms": flops / rate_chunk / 1e6, "chunk_over_floor": chunk_s / (flops / rate_chunk / 1e9),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "roofline.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
