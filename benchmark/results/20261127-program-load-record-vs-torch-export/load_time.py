import sys, time
from pathlib import Path
import torch
from torch._export.serde import serialize
from optimum_neuron_plugin.backends.cpu_serde import load_program
files = sorted(Path(sys.argv[1]).glob("*.pt2"))
load_program(files[0])
counts = {"recompile": 0}
orig = torch.fx.GraphModule.recompile
def rc(self):
    counts["recompile"] += 1; return orig(self)
torch.fx.GraphModule.recompile = rc
t = time.perf_counter()
for f in files[1:]:
    load_program(f)
print("load", len(files)-1, "programs", round(time.perf_counter()-t, 2), counts)
