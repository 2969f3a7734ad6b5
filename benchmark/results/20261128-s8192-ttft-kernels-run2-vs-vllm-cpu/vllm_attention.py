"""vLLM CPU's attention kernel (cpu_attention_with_kv_cache, "vec", block 128) over a whole prompt of N tokens at
once, as its CPU backend runs a prefill: one SmolLM2 layer (9 heads, 3 KV heads, head dim 64, fp32), 2 threads,
median of 7 calls, and that times the model's 30 layers.

    .venv/bin/python vllm_attention.py
"""

import statistics
import time

import torch
import vllm._custom_ops as ops

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 128


def layer_ms(n: int) -> float:
    q, k, v = torch.randn(n, HEADS, DIM), torch.randn(n, KV_HEADS, DIM), torch.randn(n, KV_HEADS, DIM)
    blocks = (n + BLOCK - 1) // BLOCK
    kv = torch.zeros(blocks, KV_HEADS, BLOCK, 2 * DIM).view(blocks, KV_HEADS, 2 * BLOCK, DIM)
    key_cache, value_cache = kv.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, torch.arange(n, dtype=torch.int64), "vec")
    start_loc, seq_lens = torch.tensor([0, n], dtype=torch.int32), torch.tensor([n], dtype=torch.int32)
    table = torch.arange(blocks, dtype=torch.int32)[None]
    metadata = ops.cpu_attn_get_scheduler_metadata(
        1, HEADS, KV_HEADS, DIM, seq_lens, torch.float32, start_loc, True, -1, "vec", True
    )
    out = torch.empty_like(q)

    def call() -> None:
        ops.cpu_attention_with_kv_cache(
            q, key_cache, value_cache, out, start_loc, seq_lens, DIM**-0.5, True, None, -1, table, 0.0, metadata, None
        )

    call()
    times = []
    for _ in range(7):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def main() -> None:
    torch.set_num_threads(2)
    for n in (2000, 4000, 8000):
        ms = layer_ms(n)
        gflop = 4 * HEADS * DIM * n * (n + 1) / 2 / 1e9
        print(f"{n} tokens: {ms:.1f} ms per layer, x 30 = {ms * 30 / 1e3:.2f} s ({gflop / ms * 1e3:.0f} GFLOP/s)")


if __name__ == "__main__":
    main()
