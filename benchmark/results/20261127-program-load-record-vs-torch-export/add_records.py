"""Copy an artifact, re-saving each graph program with its record (save_program)."""
import shutil, sys, time
from pathlib import Path
import torch
from optimum_neuron_plugin.backends.cpu_serde import save_program, _use_planned_dict_to_dataclass
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
if not dst.exists():
    shutil.copytree(src, dst)
_use_planned_dict_to_dataclass()
t = time.perf_counter()
for f in sorted((dst / "graphs").glob("*.pt2")):
    program = torch.export.load(str(f))
    save_program(program, f)
print("rewrote", len(list((dst / "graphs").glob("*.pt2"))), "in", round(time.perf_counter() - t, 1), "s")
