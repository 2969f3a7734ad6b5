"""Per graph of an artifact, in one process: a plain call (the first, then a second), the warm-up's traced call,
then two replays of the trace, in seconds.

    .venv/bin/python warm_cost.py ARTIFACT
"""

from __future__ import annotations

import sys
import time

import torch

from optimum_neuron_plugin import NeuronModelForCausalLM
from optimum_neuron_plugin.backends.cpu_script import traced_call
from optimum_neuron_plugin.graphs import example_inputs

NAMES = ("plain1", "plain2", "trace", "replay1", "replay2")


def timed(call, *args) -> tuple[float, object]:
    began = time.perf_counter()
    output = call(*args)
    return time.perf_counter() - began, output


def main() -> None:
    seconds, model = timed(NeuronModelForCausalLM.from_pretrained, sys.argv[1])
    print("load", round(seconds, 2))
    torch.set_num_threads(2)
    graphs, totals = model.graphs, [0.0] * 5
    for spec in model.specs:
        program = graphs.programs[spec]
        args = (graphs.params, graphs.caches, *example_inputs(spec))
        with torch.inference_mode():
            plain1, _ = timed(program, *args)
            program.validate_inputs = False
            plain2, _ = timed(program, *args)
            trace, (_, replay) = timed(traced_call, program, args)
            replay1, _ = timed(replay, *args)
            replay2, _ = timed(replay, *args)
        row = (plain1, plain2, trace, replay1, replay2)
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        print(f"{spec.key:32s} plain1 {plain1:6.3f} plain2 {plain2:6.3f} trace {trace:6.3f} replay1 {replay1:6.3f} "
              f"replay2 {replay2:6.3f}", flush=True)  # fmt: skip
    print("total " + " ".join(f"{name} {value:.2f}" for name, value in zip(NAMES, totals, strict=True)))


if __name__ == "__main__":
    main()
