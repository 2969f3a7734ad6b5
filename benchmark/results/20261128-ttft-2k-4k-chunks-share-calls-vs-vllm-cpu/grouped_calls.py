"""A 4,096-token prompt's 16 chunks of 256 on the prefill-batch-4 artifact, one chunk per call against four per
call (the n-row chunked_prefill graph), twice each: total seconds and seconds per call.

    OMP_NUM_THREADS=2 .venv/bin/python grouped_calls.py ARTIFACT
"""

import sys
import time

import torch

from optimum_neuron_plugin.runtime import chunk_loop
from optimum_neuron_plugin.runtime.model import NeuronModelForCausalLM


def run(gs, tokens: list[int], width: int) -> tuple[float, list[float]]:
    offsets, per_call = list(range(0, 4096, 256)), []
    began = time.perf_counter()
    for g in range(0, len(offsets), width):
        call_began = time.perf_counter()
        chunks = [chunk_loop.chunk_inputs(gs, 0, tokens, 0, offset) for offset in offsets[g : g + width]]
        chunk_loop.chunks_call(gs, chunks)
        per_call.append(time.perf_counter() - call_began)
    return time.perf_counter() - began, per_call


def main() -> None:
    gs = NeuronModelForCausalLM.from_pretrained(sys.argv[1]).graph_set
    tokens = torch.randint(0, 40000, (4096,)).tolist()
    for _ in range(2):
        for width in (1, 4):
            total, per_call = run(gs, tokens, width)
            print(width, f"{total:.2f}", " ".join(f"{s:.3f}" for s in per_call), flush=True)


if __name__ == "__main__":
    main()
