"""The chunk attention op's CPU kernel against vLLM CPU's kernel (cpu_attention_with_kv_cache, "vec", block 128),
one layer of SmolLM2 (9 heads, 3 KV heads, head dim 64, fp32), one row of 256 queries at several priors, 2 threads,
alternated 31 times, medians; GFLOP/s counts 4 x heads x dim per attended pair.

    PYTHONPATH=$PWD .venv/bin/python benchmark/results/20261128-ttft-2k-4k-chunks-share-calls-vs-vllm-cpu/attention_vs_vllm.py
"""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "20261128-chunk-attention-blocked-kernel"))
from chunk_kernel_ab import DIM, HEADS, T, layer_inputs, vllm_call  # noqa: E402

from optimum_neuron_plugin.backends import cpu_kernels  # noqa: E402


def main() -> None:
    torch.set_num_threads(2)
    cpu_kernels.load()
    ours = torch.ops.onp.chunk_attention.default
    for prior in (0, 1000, 2000, 4000):
        inputs = layer_inputs(prior)
        q, caches = inputs[0], inputs[3:5]
        kernels = {"ours": lambda inputs=inputs: ours(*inputs), "vllm": vllm_call(q, caches[0][1], caches[1][1], prior)}
        outputs = {name: call() for name, call in kernels.items()}
        torch.testing.assert_close(outputs["ours"], outputs["vllm"], atol=1e-4, rtol=1e-4)
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for repeat in range(31):
            for name in list(kernels) if repeat % 2 else list(kernels)[::-1]:
                began = time.perf_counter()
                kernels[name]()
                times[name].append(time.perf_counter() - began)
        ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
        gflop = 4 * HEADS * DIM * (T * prior + T * (T + 1) / 2) / 1e9
        print(
            f"prior {prior}: ours {ms['ours']:.2f} ms ({gflop / ms['ours'] * 1e3:.0f} GFLOP/s), vllm {ms['vllm']:.2f} "
            f"ms ({gflop / ms['vllm'] * 1e3:.0f}), ours/vllm {ms['ours'] / ms['vllm']:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
