import sys, time, statistics, torch
from optimum_neuron_plugin import NeuronModelForCausalLM
torch.set_num_threads(2)
A = NeuronModelForCausalLM.from_pretrained("/tmp/prof/art-flash"); B = NeuronModelForCausalLM.from_pretrained("/tmp/prof/art-math")
ctxs = {256: 200, 512: 300, 1152: 1100, 1280: 1200, 2048: 1600}
for bucket, ctx in ctxs.items():
    step = {"a": ctx, "b": ctx}
    def call(m, k):
        def f():
            m.decode(list(range(4)), [7]*4, [step[k]]*4); step[k] += 1
        return f
    fa, fb = call(A, "a"), call(B, "b")
    for _ in range(3): fa(); fb()
    ta, tb = [], []
    for _ in range(21):
        t = time.perf_counter(); fa(); ta.append(time.perf_counter() - t)
        t = time.perf_counter(); fb(); tb.append(time.perf_counter() - t)
    a, b = statistics.median(ta) * 1e3, statistics.median(tb) * 1e3
    print(f"bucket {bucket}: sdpa {a:.1f} ms  matmul-softmax {b:.1f} ms  ratio {b/a:.2f}x")
# same tokens?
A.prefill(0, list(range(100, 400))); B.prefill(0, list(range(100, 400)))
la = A.decode([0], [5], [300]); lb = B.decode([0], [5], [300])
print("first decoded ids", la, lb)
