"""The chunk attention op's CPU kernel, Python (the tree at a45b97f) against C++ (csrc/chunk_attention.cpp), on one
layer of SmolLM2-135M's shapes (9 heads, 3 KV heads, head dim 64, 256-token chunks), 2 threads, the two alternated
15 times, medians; and whether the two outputs are equal.

    .venv/bin/python benchmark/results/20261128-attention-kernels-cxx/chunk_kernel_ab.py
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from optimum_neuron_plugin.backends import cpu_kernels
from optimum_neuron_plugin.models import masks

source = subprocess.run(
    ["git", "show", "a45b97f:optimum_neuron_plugin/backends/cpu_attention.py"], capture_output=True, text=True, check=True
).stdout
source = source.replace("from ..models.attention import", "from optimum_neuron_plugin.models.attention import")
source = source.replace("from . import cpu_kernels", "from optimum_neuron_plugin.backends import cpu_kernels")
source = "\n".join(line for line in source.splitlines() if ".register_kernel(" not in line)
module = Path(tempfile.mkdtemp()) / "python_kernel.py"
module.write_text(source)
sys.path.insert(0, str(module.parent))
from python_kernel import chunk_attention_cpu as python_kernel  # noqa: E402

cpu_kernels.load()
cxx_kernel = torch.ops.onp_cpu.chunk_attention.default
torch.set_num_threads(2)
HEADS, KV_HEADS, DIM, T, SLOTS, S = 9, 3, 64, 256, 4, 1024
print("| rows | starts | prior bucket | Python ms | C++ ms | C++ / Python | equal |")
print("|---:|---|---:|---:|---:|---:|---|")
for n, starts, bucket in ((1, [0], 0), (1, [256], 256), (4, [0, 0, 0, 0], 0), (4, [256, 512, 256, 0], 512)):
    q, k, v = torch.randn(n, T, HEADS, DIM), torch.randn(n, T, KV_HEADS, DIM), torch.randn(n, T, KV_HEADS, DIM)
    caches = torch.randn(SLOTS, KV_HEADS, S, DIM), torch.randn(SLOTS, KV_HEADS, S, DIM)
    positions = torch.tensor([[s + t for t in range(T)] for s in starts], dtype=torch.int32)
    bias = masks.chunk_bias(positions, bucket, HEADS // KV_HEADS, torch.float32)
    args = (q, k, v, *caches, torch.arange(n), positions, bias, 0, None, None)
    equal = torch.equal(python_kernel(*args), cxx_kernel(*args))
    times = {"python": [], "cxx": []}
    for _ in range(15):
        for name, kernel in (("python", python_kernel), ("cxx", cxx_kernel)):
            began = time.perf_counter()
            kernel(*args)
            times[name].append(time.perf_counter() - began)
    py, cxx = (sorted(times[name])[7] * 1e3 for name in ("python", "cxx"))
    print(f"| {n} | {starts} | {bucket} | {py:.2f} | {cxx:.2f} | {cxx / py:.2f} | {equal} |")
