import time, torch, statistics
torch.set_num_threads(2)
from optimum_neuron_plugin.backends.cpu_linear import _packed_linear
shapes = [(1728, 576), (576, 576), (3072, 576), (576, 1536)]
def bench(f, reps=20):
    f(); f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return min(ts)
for M in (128, 256, 512):
    tot = 0; flops = 0; totv = 0; totm = 0
    for N, K in shapes:
        w = torch.randn(N, K); x = torch.randn(M, K)
        pw = torch.ops.mkldnn._reorder_linear_weight(w)
        tot += bench(lambda: _packed_linear(x, pw, None))
        totm += bench(lambda: torch.nn.functional.linear(x, w))
        try:
            from vllm import _custom_ops as ops
            h = ops.create_onednn_mm(w.t(), 32)
            totv += bench(lambda: ops.onednn_mm(h, x, None))
        except Exception as e:
            totv = float('nan'); err = e
        flops += 2 * M * N * K
    print(f"M {M}: packed {flops/tot/1e9:.0f} GFLOP/s, mkl {flops/totm/1e9:.0f}, vllm onednn_mm {flops/totv/1e9:.0f}")
