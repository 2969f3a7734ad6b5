"""How close an artifact's decode step and prompt chunk run to this host's floors: the time to read the weights once
at the host's memory bandwidth (decode) and the chunk's linear FLOPs at the host's fp32 GEMM rate (prefill).

    .venv/bin/python benchmark/graph_cases/roofline.py ARTIFACT [--threads 2] [--context 300] [--chunk 256] [--out DIR]

- bandwidth: the best of a streaming read (sum) and a matrix-vector product over a weight-sized fp32 tensor;
- GEMM rate: torch.mm at the model's widest linear with the chunk's rows (what a chunk's linears are), and square;
- few-row kernel: onp_cpu::rows_linear (what the decode graphs' linears run) over every weight once, for 1 and
  batch_size rows, in bytes read per second;
- decode: one decode step of batch_size rows at --context positions, alternated with the same step of the artifact
  loaded again with every linear on oneDNN (cpu_linear.ROWS_KERNEL_MAX = 0);
- chunk: one prefill of a --chunk-token prompt (one chunk call).
Writes roofline.json into --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import add_out, call_seconds, prompt_ids, write_json

from optimum_neuron_plugin import NeuronModelForCausalLM
from optimum_neuron_plugin.backends import cpu_kernels, cpu_linear


def best_seconds(call, repeats: int) -> float:
    return min(call_seconds(call, repeats))


def bandwidth(nbytes: int, repeats: int) -> dict:
    weights, vector = torch.rand(nbytes // 4 // 576, 576), torch.rand(576)
    read = best_seconds(lambda: weights.sum(), repeats)
    gemv = best_seconds(lambda: torch.mv(weights, vector), repeats)
    size = weights.numel() * 4
    return {"bytes": size, "sum_gb_s": size / read / 1e9, "gemv_gb_s": size / gemv / 1e9}


def gemm_rate(rows: int, inner: int, outer: int, repeats: int) -> float:
    a, b = torch.rand(rows, inner), torch.rand(inner, outer)
    return 2 * rows * inner * outer / best_seconds(lambda: torch.mm(a, b), repeats) / 1e9


def rows_kernel_gb_s(weights: list[torch.Tensor], rows: int, repeats: int) -> float:
    """onp_cpu::rows_linear (on its own packing) over every 2-D weight once, `rows` input rows: bytes read per s."""
    cpu_kernels.load()
    packed = [torch.ops.onp_cpu.pack_rows_weight(t.float().contiguous()) for t in weights]
    inputs = [torch.rand(rows, t.shape[1]) for t in weights]

    def products() -> list[torch.Tensor]:
        kernel = torch.ops.onp_cpu.rows_linear
        return [kernel(x, w, None, t.shape[0]) for x, w, t in zip(inputs, packed, weights, strict=True)]

    return sum(t.numel() * 4 for t in weights) / best_seconds(products, repeats) / 1e9


def linear_flops_per_token(params: dict[str, torch.Tensor]) -> int:
    """2 x the weights of every linear a prompt token goes through (not the embedding, not the LM head, which runs
    for the last token only)."""
    linears = [t for name, t in params.items() if t.dim() == 2 and "embed" not in name and "lm_head" not in name]
    return 2 * sum(t.numel() for t in linears)


def decode_steps(models: dict[str, NeuronModelForCausalLM], context: int, repeats: int) -> dict[str, float]:
    """Median ms of each model's decode step at `context` positions (every row prefilled), timed in turns."""
    batch = next(iter(models.values())).neuron_config.batch_size
    vocab = next(iter(models.values())).args.vocab_size
    position = {}
    for name, model in models.items():
        model.warm_up()
        for slot in range(batch):
            model.prefill(slot, prompt_ids(context, vocab))
        position[name] = context

    def step(name: str) -> None:
        models[name].decode(list(range(batch)), [7] * batch, [position[name]] * batch)
        position[name] = context + (position[name] - context + 1) % 64  # stays within the context's bucket

    times: dict[str, list[float]] = {name: [] for name in models}
    for name in models:
        step(name)
    for _ in range(repeats):
        for name in models:
            began = time.perf_counter()
            step(name)
            times[name].append(time.perf_counter() - began)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    add_out(parser, "roofline")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = NeuronModelForCausalLM.from_pretrained(args.artifact)
    few_rows = cpu_linear.ROWS_KERNEL_MAX
    cpu_linear.ROWS_KERNEL_MAX = 0  # every linear of this load on oneDNN's packing
    try:
        onednn = NeuronModelForCausalLM.from_pretrained(args.artifact)
    finally:
        cpu_linear.ROWS_KERNEL_MAX = few_rows
    decode = decode_steps({"rows": model, "onednn": onednn}, args.context, args.repeats)

    params = {name: t for name, t in model.params.items() if torch.is_tensor(t)}
    weight_bytes = sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in params.values()}.values())
    vocab, batch = model.args.vocab_size, model.neuron_config.batch_size
    prompt = prompt_ids(args.chunk, vocab)
    chunk_s = statistics.median(call_seconds(lambda: model.prefill(0, prompt), max(1, args.repeats // 4)))
    memory = bandwidth(weight_bytes, 10)
    gb_s = max(memory["sum_gb_s"], memory["gemv_gb_s"])
    matrices = [t for t in params.values() if t.dim() == 2]
    widest = max((t for t in matrices if t.shape[0] < vocab), key=lambda t: t.numel())
    rate_chunk = gemm_rate(args.chunk, widest.shape[1], widest.shape[0], 10)
    flops = linear_flops_per_token(params) * args.chunk
    floor_ms = weight_bytes / gb_s / 1e6
    result = {
        "artifact": str(args.artifact), "threads": args.threads, "weight_bytes": weight_bytes, **memory,
        "decode_context": args.context, "decode_ms": decode["rows"], "decode_onednn_linears_ms": decode["onednn"],
        "decode_floor_ms": floor_ms, "decode_over_floor": decode["rows"] / floor_ms,
        **{f"rows_linears_gb_s_{rows}_rows": rows_kernel_gb_s(matrices, rows, 10) for rows in (1, batch)},
        "gemm_gflop_s_chunk_rows": rate_chunk, "gemm_gflop_s_1024": gemm_rate(1024, 1024, 1024, 5),
        "widest_linear": list(widest.shape), "chunk_tokens": args.chunk, "chunk_ms": chunk_s * 1e3,
        "chunk_linear_gflop": flops / 1e9, "chunk_floor_ms": flops / rate_chunk / 1e6,
        "chunk_over_floor": chunk_s / (flops / rate_chunk / 1e9),
    }  # fmt: skip
    for key, value in result.items():
        print(f"[roofline] {key}: {value:.4g}" if isinstance(value, float) else f"[roofline] {key}: {value}")
    write_json(args.out, "roofline.json", result, "roofline")


if __name__ == "__main__":
    main()
