"""Decode step with each linear packed alone (old) vs linears of one input stacked (new): same artifact, one process,
alternated. The older loader: git show a19c399:optimum_neuron_plugin/backends/cpu_linear.py > /tmp/prof/old_cpu_linear.py"""
import sys, time, statistics, importlib.util, torch
from optimum_neuron_plugin import NeuronModelForCausalLM
from optimum_neuron_plugin.backends import cpu as cpu_backend
torch.set_num_threads(2)
art = sys.argv[1]
spec = importlib.util.spec_from_file_location("old_cpu_linear", "/tmp/prof/old_cpu_linear.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
new_fn = cpu_backend.use_packed_linears
cpu_backend.use_packed_linears = old.use_packed_linears
A = NeuronModelForCausalLM.from_pretrained(art)
A.warm_up()
cpu_backend.use_packed_linears = new_fn
B = NeuronModelForCausalLM.from_pretrained(art)
B.warm_up()
ctxs = {256: 200, 512: 300, 1024: 1000, 1280: 1100, 2048: 1600}
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
    print(f"decode, bucket {bucket}: one product per linear {a:.1f} ms  stacked {b:.1f} ms  ratio {b/a:.2f}x", flush=True)
def chunk(m):
    return lambda: m.prefill(0, list(range(100, 228)))
ta, tb = [], []
for _ in range(9):
    t = time.perf_counter(); chunk(A)(); ta.append(time.perf_counter() - t)
    t = time.perf_counter(); chunk(B)(); tb.append(time.perf_counter() - t)
a, b = statistics.median(ta) * 1e3, statistics.median(tb) * 1e3
print(f"128-token chunk: one product per linear {a:.1f} ms  stacked {b:.1f} ms  ratio {b/a:.2f}x")
la, lb = A.prefill(1, list(range(100, 400))), B.prefill(1, list(range(100, 400)))
print("prefill logits max abs diff", (la - lb).abs().max().item(), "argmax", int(la.argmax()), int(lb.argmax()))
