"""One 256-token chunked_prefill call at prior 0 and at prior 2048: the wall time of 5 calls, then torch.profiler's
self CPU time per op, per call, over 3 calls.

    OMP_NUM_THREADS=2 .venv/bin/python chunk_profile.py ARTIFACT
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
    tokens = torch.randint(0, 40000, (4096,)).tolist()

    def call(offset: int) -> None:
        chunk_loop.chunks_call(gs, [chunk_loop.chunk_inputs(gs, 0, tokens, 0, offset)])

    for offset in (0, 2048):
        for _ in range(3):
            call(offset)
        began = time.perf_counter()
        for _ in range(5):
            call(offset)
        wall = (time.perf_counter() - began) / 5
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                call(offset)
        per_op: dict[str, float] = defaultdict(float)
        for event in prof.key_averages():
            per_op[event.key] += event.self_cpu_time_total / 3 / 1e3
        print(f"offset {offset}: wall {wall * 1000:.1f} ms; profiled self total {sum(per_op.values()):.1f} ms")
        for name, ms in sorted(per_op.items(), key=lambda item: -item[1])[:18]:
            print(f"   {ms:8.2f} ms  {name}")


if __name__ == "__main__":
    main()
