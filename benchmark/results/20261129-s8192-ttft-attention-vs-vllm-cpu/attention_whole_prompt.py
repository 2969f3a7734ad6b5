"""A whole prompt's chunk attention in process, one SmolLM2-135M layer (9 heads, 3 KV heads, head dim 64, fp32),
2 threads: the prefill-batch graph's calls (4 successive 256-token chunks of the prompt per call, the last chunk
padded with its last token, as runtime/chunk_loop.py pads) through this tree's kernel and through the kernel at BASE
(built here under the namespace onp_base), against vLLM CPU's kernel over the whole prompt in one call (as
vllm/v1/attention/backends/cpu_attn.py calls it: block size 128, causal). The three alternate call by call; medians.

    PYTHONPATH=$PWD flock /tmp/heavy.lock nice -n 5 .venv/bin/python \\
        benchmark/results/20261129-s8192-ttft-attention-vs-vllm-cpu/attention_whole_prompt.py [TOKENS...]
"""

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

import optimum_neuron_plugin.models.attention  # noqa: F401  (defines onp::chunk_attention)
from optimum_neuron_plugin.backends import cpu_kernels
from optimum_neuron_plugin.models import masks

BASE = "bc5600b"
HEADS, KV_HEADS, DIM, T, ROWS, BLOCK, REPEATS = 9, 3, 64, 256, 4, 128, 15
CSRC = "optimum_neuron_plugin/backends/csrc"


def base_kernel():
    build = Path(tempfile.mkdtemp())
    for name in ("chunk_attention.cpp", "chunk_tiles.h", "work_queue.h"):
        source = subprocess.run(["git", "show", f"{BASE}:{CSRC}/{name}"], capture_output=True, text=True, check=True)
        text = source.stdout.replace("TORCH_LIBRARY_IMPL(onp, CPU", "TORCH_LIBRARY_IMPL(onp_base, CPU")
        (build / name).write_text(text)
    schema = str(torch.ops.onp.chunk_attention.default._schema).replace("onp::", "")
    library = torch.library.Library("onp_base", "DEF")
    library.define(schema)
    cpp_extension.load("onp_base_chunk", [str(build / "chunk_attention.cpp")], extra_cflags=cpu_kernels.compile_flags(),
                       extra_ldflags=["-fopenmp"], build_directory=str(build), is_python_module=False)  # fmt: skip
    return torch.ops.onp_base.chunk_attention.default, library


def graph_calls(n: int) -> list[tuple]:
    """The op's inputs for each prefill-batch call of an n-token prompt in cache row 0 (its K/V already cached)."""
    generator = torch.Generator().manual_seed(n)
    k_cache, v_cache = (torch.randn(1, KV_HEADS, n, DIM, generator=generator) for _ in range(2))
    chunks, calls = -(-n // T), []
    for first in range(0, chunks, ROWS):
        starts = [c * T for c in range(first, min(first + ROWS, chunks))]
        positions = torch.stack([torch.arange(s, s + T).clamp(max=n - 1) for s in starts]).to(torch.int32)
        q = torch.randn(len(starts), T, HEADS, DIM, generator=generator)
        real = min(n - starts[-1], T)
        q[-1, real:] = q[-1, real - 1]
        k, v = (torch.stack([c[0][:, p.long()].transpose(0, 1) for p in positions]) for c in (k_cache, v_cache))
        bias = masks.chunk_bias(positions, starts[-1], HEADS // KV_HEADS, torch.float32)
        ids = torch.zeros(len(starts), dtype=torch.int64)
        calls.append((q, k, v, k_cache, v_cache, ids, positions, bias, 0, None, None))
    return calls


def vllm_whole_prompt(n: int):
    import vllm._custom_ops as ops

    q, k, v = torch.randn(n, HEADS, DIM), torch.randn(n, KV_HEADS, DIM), torch.randn(n, KV_HEADS, DIM)
    blocks = -(-n // BLOCK)
    kv = torch.zeros(blocks, KV_HEADS, BLOCK, 2 * DIM).view(blocks, KV_HEADS, 2 * BLOCK, DIM)
    key_cache, value_cache = kv.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, torch.arange(n, dtype=torch.int64), "vec")
    start_loc, seq_lens = torch.tensor([0, n], dtype=torch.int32), torch.tensor([n], dtype=torch.int32)
    table = torch.arange(blocks, dtype=torch.int32)[None]
    metadata = ops.cpu_attn_get_scheduler_metadata(
        1, HEADS, KV_HEADS, DIM, seq_lens, torch.float32, start_loc, True, -1, "vec", True
    )
    out = torch.empty_like(q)
    return lambda: ops.cpu_attention_with_kv_cache(
        q, key_cache, value_cache, out, start_loc, seq_lens, DIM**-0.5, True, None, -1, table, 0.0, metadata, None
    )


def main() -> None:
    torch.set_num_threads(2)
    cpu_kernels.load()
    ours, (base, _library) = torch.ops.onp.chunk_attention.default, base_kernel()
    print("| prompt tokens | this tree ms | BASE ms | vLLM CPU ms | this tree / BASE | this tree / vLLM CPU |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in [int(x) for x in sys.argv[1:]] or [256, 2000, 4000, 8000]:
        calls = graph_calls(n)
        for call in calls:
            torch.testing.assert_close(ours(*call), base(*call), atol=1e-4, rtol=1e-4)
        sides = {
            "ours": lambda calls=calls: [ours(*c) for c in calls],
            "base": lambda calls=calls: [base(*c) for c in calls],
            "vllm": vllm_whole_prompt(n),
        }
        times = {name: [] for name in sides}
        for repeat in range(REPEATS):
            for name in list(sides)[repeat % 3 :] + list(sides)[: repeat % 3]:
                began = time.perf_counter()
                sides[name]()
                times[name].append(time.perf_counter() - began)
        ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
        print(
            f"| {n} | {ms['ours']:.2f} | {ms['base']:.2f} | {ms['vllm']:.2f} | {ms['ours'] / ms['base']:.3f} | "
            f"{ms['ours'] / ms['vllm']:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
