import time, sys, torch
from optimum_neuron_plugin.runtime.model import NeuronModelForCausalLM
from optimum_neuron_plugin.runtime import chunk_loop
path = sys.argv[1]
m = NeuronModelForCausalLM.from_pretrained(path) if hasattr(NeuronModelForCausalLM, "from_pretrained") else None
gs = m.graph_set
tokens = torch.randint(0, 40000, (4000,)).tolist()
def run(width):
    nc = gs.neuron_config
    size = nc.prefill_length
    pieces = list(range(0, 4096 - 256 + 1, 256))[:16]
    t0 = time.perf_counter(); per = []
    for g in range(0, 16, width):
        group = pieces[g:g+width]
        a = time.perf_counter()
        chunk_loop.chunks_call(gs, [chunk_loop.chunk_inputs(gs, 0, tokens + [1]*96, 0, off) for off in group])
        per.append(time.perf_counter() - a)
    return time.perf_counter() - t0, per
for rep in range(2):
    for w in (1, 4):
        total, per = run(w)
        print(w, f"{total:.2f}", " ".join(f"{p:.3f}" for p in per), flush=True)
