import sys, time, torch
from optimum_neuron_plugin import NeuronModelForCausalLM
out = []
for a in sys.argv[1:]:
    t = time.perf_counter()
    m = NeuronModelForCausalLM.from_pretrained(a)
    t_load = time.perf_counter() - t
    t = time.perf_counter(); m.warm_up(); t_warm = time.perf_counter() - t
    toks = [(i * 7919) % 49000 + 5 for i in range(300)]
    logits = m.prefill(0, toks)
    r = m.decode([0], [int(logits.argmax())], [300])
    out.append((logits, r))
    print(a, "from_pretrained", round(t_load, 2), "warm_up", round(t_warm, 2), type(r).__name__)
a, b = out
print("prefill logits equal:", torch.equal(a[0], b[0]))
print("decode:", a[1], b[1])
