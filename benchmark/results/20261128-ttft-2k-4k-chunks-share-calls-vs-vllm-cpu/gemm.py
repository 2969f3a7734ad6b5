"""SmolLM2's four linear shapes (q|k|v 576->960, gate|up 576->3072, down 1536->576, o 576->576) at several row
counts, 2 threads: oneDNN on prepacked weights (what the CPU programs run) against F.linear, in GFLOP/s."""

import time

import torch

SHAPES = [(576, 960), (576, 3072), (1536, 576), (576, 576)]


def seconds(call, repeats: int) -> float:
    call()
    began = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - began) / repeats


def main() -> None:
    torch.set_num_threads(2)
    for rows in (256, 512, 1024, 2000, 4000):
        packed = plain = flops = 0.0
        for inputs, outputs in SHAPES:
            x, weight = torch.randn(rows, inputs), torch.randn(outputs, inputs)
            prepacked = torch.ops.mkldnn._reorder_linear_weight(weight)
            repeats = max(3, int(2e9 / (2 * rows * inputs * outputs)))
            packed += seconds(
                lambda x=x, w=prepacked: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""), repeats
            )
            plain += seconds(lambda x=x, w=weight: torch.nn.functional.linear(x, w), repeats)
            flops += 2 * rows * inputs * outputs
        print(
            rows, f"packed {flops / packed / 1e9:.1f} GFLOP/s  mkl-linear {flops / plain / 1e9:.1f} GFLOP/s", flush=True
        )


if __name__ == "__main__":
    main()
