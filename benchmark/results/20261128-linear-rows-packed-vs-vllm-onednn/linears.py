"""fp32 linear throughput by row count: the CPU backend's packed linear, MKL's F.linear and vLLM CPU's oneDNN matmul
on SmolLM2-135M's four products per layer, 2 threads, best of 20 calls each, summed (summary.md)."""

import time

import torch
from vllm import _custom_ops as ops

from optimum_neuron_plugin.backends.cpu_linear import _packed_linear

SHAPES = [(1728, 576), (576, 576), (3072, 576), (576, 1536)]  # q/k/v stacked, o, gate/up stacked, down


def best_seconds(call, repeats: int = 20) -> float:
    call(), call()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    torch.set_num_threads(2)
    for rows in (128, 256, 512):
        seconds = {"packed": 0.0, "mkl": 0.0, "vllm onednn_mm": 0.0}
        flops = 0
        for n, k in SHAPES:
            weight, x = torch.randn(n, k), torch.randn(rows, k)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight)
            handler = ops.create_onednn_mm(weight.t(), 32)
            calls = {
                "packed": lambda x=x, packed=packed: _packed_linear(x, packed, None),
                "mkl": lambda x=x, weight=weight: torch.nn.functional.linear(x, weight),
                "vllm onednn_mm": lambda x=x, handler=handler: ops.onednn_mm(handler, x, None),
            }
            for name, call in calls.items():
                seconds[name] += best_seconds(call)
            flops += 2 * rows * n * k
        print(f"M {rows}: " + ", ".join(f"{name} {flops / s / 1e9:.0f} GFLOP/s" for name, s in seconds.items()))


if __name__ == "__main__":
    main()
