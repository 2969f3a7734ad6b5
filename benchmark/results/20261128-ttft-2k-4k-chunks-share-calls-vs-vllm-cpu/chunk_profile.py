import sys, time, torch
from collections import defaultdict
from torch.profiler import profile, ProfilerActivity
from optimum_neuron_plugin.runtime.model import NeuronModelForCausalLM
from optimum_neuron_plugin.runtime import chunk_loop
m = NeuronModelForCausalLM.from_pretrained(sys.argv[1])
gs = m.graph_set
tokens = torch.randint(0, 40000, (4096,)).tolist()
def call(off):
    chunk_loop.chunks_call(gs, [chunk_loop.chunk_inputs(gs, 0, tokens, 0, off)])
for off in (0, 2048):
    for _ in range(3): call(off)
    t = time.perf_counter()
    for _ in range(5): call(off)
    wall = (time.perf_counter() - t) / 5
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3): call(off)
    agg = defaultdict(float)
    for e in prof.key_averages():
        agg[e.key] += e.self_cpu_time_total / 3 / 1e3
    total = sum(agg.values())
    print(f"offset {off}: wall {wall*1000:.1f} ms; profiled self total {total:.1f} ms")
    for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:18]:
        print(f"   {v:8.2f} ms  {k}")
