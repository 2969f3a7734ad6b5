"""One layer's chunk attention at SmolLM2-135M's shapes (9 heads, 3 KV heads, head dim 64, fp32, 2 threads), one
row of 256 queries at several prior lengths: the blocked kernel (csrc/chunk_attention.cpp of this tree), the two
flash calls merged by their log-sum-exp (the same file at BASE, built here under the namespace onp_old) and vLLM
CPU's attention kernel (torch.ops._C.cpu_attention_with_kv_cache, as vllm/v1/attention/backends/cpu_attn.py calls
it: block size 128, its scheduler metadata, causal). The three alternate call by call; medians.

    PYTHONPATH=$PWD flock /tmp/heavy.lock nice -n 5 .venv/bin/python \\
        benchmark/results/20261128-chunk-attention-blocked-kernel/chunk_kernel_ab.py [--repeats 21]
"""

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

from optimum_neuron_plugin.backends import cpu_kernels
from optimum_neuron_plugin.models import masks

BASE = "c83f1c1"
HEADS, KV_HEADS, DIM, T, BLOCK = 9, 3, 64, 256, 128


def old_kernel():
    source = subprocess.run(
        ["git", "show", f"{BASE}:optimum_neuron_plugin/backends/csrc/chunk_attention.cpp"],
        capture_output=True, text=True, check=True,
    ).stdout.replace("onp_cpu", "onp_old")  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "old_chunk_attention.cpp"
    path.write_text(source)
    cpp_extension.load("onp_old_chunk", [str(path)], extra_cflags=cpu_kernels.compile_flags(),
                       extra_ldflags=["-fopenmp"], is_python_module=False)  # fmt: skip
    return torch.ops.onp_old.chunk_attention.default


def vllm_call(q, keys, values, prior):
    """vLLM CPU's kernel on the same keys, in its paged layout: [blocks, KVH, BLOCK, 2 D] viewed as K and V."""
    import vllm._custom_ops as ops

    length = prior + T
    blocks = (length + BLOCK - 1) // BLOCK
    kv = torch.zeros(blocks, KV_HEADS, BLOCK, 2 * DIM).view(blocks, KV_HEADS, 2 * BLOCK, DIM)
    key_cache, value_cache = kv.chunk(2, dim=2)
    slots = torch.arange(length, dtype=torch.int64)  # block table: block b at b
    ops.cpu_attn_reshape_and_cache(
        keys.transpose(0, 1).contiguous(), values.transpose(0, 1).contiguous(), key_cache, value_cache, slots, "vec"
    )  # its layout for the "vec" ISA (fp32, block size a multiple of 32, no AMX)
    start_loc = torch.tensor([0, T], dtype=torch.int32)
    seq_lens = torch.tensor([length], dtype=torch.int32)
    table = torch.arange(blocks, dtype=torch.int32)[None]
    metadata = ops.cpu_attn_get_scheduler_metadata(
        1, HEADS, KV_HEADS, DIM, seq_lens, torch.float32, start_loc, True, -1, "vec", True
    )
    query = q[0].contiguous()  # [T, H, D]
    out = torch.empty_like(query)

    def call():
        ops.cpu_attention_with_kv_cache(
            query, key_cache, value_cache, out, start_loc, seq_lens, DIM**-0.5, True, None, -1, table, 0.0,
            metadata, None,
        )  # fmt: skip
        return out.reshape(1, T, HEADS * DIM)

    return call


def layer_inputs(prior: int) -> tuple:
    """The op's inputs for one row of T queries after `prior` cached positions (cache row 1, its own K/V written)."""
    generator = torch.Generator().manual_seed(prior)
    q = torch.randn(1, T, HEADS, DIM, generator=generator)
    k, v = (torch.randn(1, T, KV_HEADS, DIM, generator=generator) for _ in range(2))
    caches = [torch.randn(2, KV_HEADS, prior + T, DIM, generator=generator) for _ in range(2)]
    for cache, own in zip(caches, (k, v), strict=True):
        cache[1, :, prior:] = own[0].transpose(0, 1)
    positions = torch.arange(prior, prior + T, dtype=torch.int32)[None]
    bias = masks.chunk_bias(positions, prior, HEADS // KV_HEADS, torch.float32)
    return (q, k, v, *caches, torch.tensor([1]), positions, bias, 0, None, None)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--priors", default="0,256,1000,2000,4000")
    args = parser.parse_args()
    torch.set_num_threads(2)
    cpu_kernels.load()
    new, old = torch.ops.onp.chunk_attention.default, old_kernel()
    print("| prior | pairs (M) | blocked ms | flash x2 ms | vLLM CPU ms | blocked / flash x2 | blocked / vLLM CPU |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for prior in (int(p) for p in args.priors.split(",")):
        inputs = layer_inputs(prior)
        q, caches = inputs[0], inputs[3:5]
        kernels = {
            "blocked": lambda inputs=inputs: new(*inputs),
            "flash": lambda inputs=inputs: old(*inputs),
            "vllm": vllm_call(q, caches[0][1], caches[1][1], prior),
        }
        outputs = {name: call() for name, call in kernels.items()}
        for name in ("flash", "vllm"):
            torch.testing.assert_close(outputs["blocked"], outputs[name], atol=1e-4, rtol=1e-4, msg=name)
        times = {name: [] for name in kernels}
        for repeat in range(args.repeats):
            names = list(kernels)[repeat % 3 :] + list(kernels)[: repeat % 3]
            for name in names:
                began = time.perf_counter()
                kernels[name]()
                times[name].append(time.perf_counter() - began)
        ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
        pairs = HEADS * (T * prior + T * (T + 1) // 2) / 1e6
        print(
            f"| {prior} | {pairs:.1f} | {ms['blocked']:.2f} | {ms['flash']:.2f} | {ms['vllm']:.2f} | "
            f"{ms['blocked'] / ms['flash']:.2f} | {ms['blocked'] / ms['vllm']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
