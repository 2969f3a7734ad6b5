import os, sys, time
os.environ["ONP_BACKEND"]="cpu"
import torch
from optimum_neuron_plugin import NeuronModelForCausalLM
import optimum_neuron_plugin.backends.cpu
for i in range(2):
    t=time.process_time()
    m = NeuronModelForCausalLM.from_pretrained(sys.argv[1])
    t1=time.process_time()
    m.warm_up() if hasattr(m,'warm_up') else None
    print(f'load cpu {t1-t:.2f} s, warm-up cpu {time.process_time()-t1:.2f} s')
    del m
