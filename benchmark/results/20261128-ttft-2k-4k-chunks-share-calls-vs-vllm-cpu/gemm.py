import time, torch
torch.set_num_threads(2)
shapes = [(576, 576*3-576*2+ 192*2), (576, 3072), (1536, 576), (576, 576)]  # qkv (576+192+192), gate+up, down, o
shapes = [(576, 960), (576, 3072), (1536, 576), (576, 576)]
def bench(f, reps):
    f(); t=time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter()-t)/reps
for M in (256, 512, 1024, 2000, 4000):
    tot_p = tot_m = fl = 0
    for k, n in shapes:
        x = torch.randn(M, k); w = torch.randn(n, k)
        pw = torch.ops.mkldnn._reorder_linear_weight(w)
        reps = max(3, int(2e9 / (2*M*k*n)))
        tp = bench(lambda: torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], ""), reps)
        tm = bench(lambda: torch.nn.functional.linear(x, w), reps)
        tot_p += tp; tot_m += tm; fl += 2*M*k*n
    print(M, f"packed {fl/tot_p/1e9:.1f} GFLOP/s  mkl-linear {fl/tot_m/1e9:.1f} GFLOP/s", flush=True)
