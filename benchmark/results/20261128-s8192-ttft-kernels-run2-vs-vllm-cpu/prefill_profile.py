"""Whole prefills through the runner's chunk loop (runtime/chunk_loop.py, prefill_batch), one prompt alone: the wall
time of 3 runs after a warm-up, then torch.profiler's self CPU time per op over one more.

    OMP_NUM_THREADS=2 .venv/bin/python prefill_profile.py ARTIFACT [TOKENS...]
"""

import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from optimum_neuron_plugin.runtime import chunk_loop
from optimum_neuron_plugin.runtime.model import NeuronModelForCausalLM


def main() -> None:
    gs = NeuronModelForCausalLM.from_pretrained(sys.argv[1]).graph_set
    for n in [int(x) for x in sys.argv[2:]] or [2000, 4000]:
        tokens = torch.randint(0, 40000, (n,)).tolist()

        def run(tokens=tokens) -> None:
            chunk_loop.prefill_batch(gs, [(0, tokens, 0)])

        run()
        walls = []
        for _ in range(3):
            began = time.perf_counter()
            run()
            walls.append(time.perf_counter() - began)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        per_op: dict[str, float] = defaultdict(float)
        for event in prof.key_averages():
            per_op[event.key] += event.self_cpu_time_total / 1e3
        walls_s = " ".join(f"{w:.2f}" for w in walls)
        print(f"{n} tokens: wall {walls_s} s; profiled {sum(per_op.values()):.0f} ms", flush=True)
        for name, ms in sorted(per_op.items(), key=lambda item: -item[1])[:12]:
            print(f"   {ms:8.1f} ms  {name}")


if __name__ == "__main__":
    main()
