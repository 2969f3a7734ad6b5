import sys, time, torch
from torch.profiler import profile, ProfilerActivity
from optimum_neuron_plugin import NeuronModelForCausalLM
m = NeuronModelForCausalLM.from_pretrained(sys.argv[1])
n = int(sys.argv[2])
toks = [(i * 7919) % 49000 + 5 for i in range(n)]
for _ in range(2): m.prefill(0, toks)
ts=[]
for _ in range(5):
    t=time.perf_counter(); m.prefill(0, toks); ts.append(time.perf_counter()-t)
print("prefill", n, "ms", sorted(ts)[2]*1e3, "calls", m.prefill_calls(n))
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
    m.prefill(0, toks)
print(p.key_averages(group_by_input_shape=False).table(sort_by="self_cpu_time_total", row_limit=25))
