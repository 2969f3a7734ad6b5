"""What the warm-up costs per graph: a plain call (the first, then a second), the warm-up's traced call, then two
replays of the trace, in seconds, every graph of one artifact in one process.

    .venv/bin/python benchmark/graph_cases/warm_up.py ARTIFACT [--threads 2] [--out DIR]

Writes warm_up.json (per graph and totals) and warm_up.md into --out.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from common import add_out, write_json

from optimum_neuron_plugin import NeuronModelForCausalLM
from optimum_neuron_plugin.backends.cpu_script import traced_call
from optimum_neuron_plugin.graphs import example_inputs

NAMES = ("plain1", "plain2", "trace", "replay1", "replay2")


def timed(call, *args) -> tuple[float, object]:
    began = time.perf_counter()
    output = call(*args)
    return time.perf_counter() - began, output


def per_graph(model) -> dict[str, dict[str, float]]:
    graphs, rows = model.graphs, {}
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
        rows[spec.key] = dict(zip(NAMES, (plain1, plain2, trace, replay1, replay2), strict=True))
        print(f"[warm_up] {spec.key:32s} " + " ".join(f"{k} {v:6.3f}" for k, v in rows[spec.key].items()), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    add_out(parser, "warm-up-traced-vs-plain-first-call")
    args = parser.parse_args()
    load, model = timed(NeuronModelForCausalLM.from_pretrained, str(args.artifact))
    torch.set_num_threads(args.threads)
    rows = per_graph(model)
    totals = {name: sum(row[name] for row in rows.values()) for name in NAMES}
    lines = [f"Warm-up of {args.artifact.name}: {len(rows)} graphs, {args.threads} threads, load {load:.2f} s", ""]
    lines += ["| seconds | " + " | ".join(NAMES) + " |", "|---|" + "---:|" * len(NAMES)]
    lines += ["| total | " + " | ".join(f"{totals[n]:.2f}" for n in NAMES) + " |"]
    print("\n".join(lines))
    write_json(args.out, "warm_up.json", {"load_seconds": load, "totals": totals, "graphs": rows}, "warm_up")
    (args.out / "warm_up.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
