"""Loading artifacts: per artifact, its graph programs loaded (`cpu_serde.load_program`, after one, counting
GraphModule recompiles), then the model (`from_pretrained`, `warm_up`), a prefill and a decode step; the artifacts'
prefill logits and decode tokens compared. Each artifact in a fresh process, in turn, --rounds times.

    .venv/bin/python benchmark/graph_cases/program_load.py ARTIFACT [ARTIFACT ...] [--rounds 2] [--out DIR]

Writes program_load.json and program_load.md into --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import add_out, prompt_ids, write_json


def load_programs(artifact: Path) -> dict:
    import torch

    from optimum_neuron_plugin.backends.cpu_serde import load_program

    files = sorted((artifact / "graphs").glob("*.pt2"))
    load_program(files[0])
    counts = {"recompiles": 0}
    recompile = torch.fx.GraphModule.recompile

    def counted(self):
        counts["recompiles"] += 1
        return recompile(self)

    torch.fx.GraphModule.recompile = counted
    began = time.perf_counter()
    for path in files[1:]:
        load_program(path)
    return {"programs": len(files) - 1, "load_seconds": time.perf_counter() - began, **counts}


def load_model(artifact: Path) -> dict:
    from optimum_neuron_plugin import NeuronModelForCausalLM

    began = time.perf_counter()
    model = NeuronModelForCausalLM.from_pretrained(str(artifact))
    loaded = time.perf_counter() - began
    began = time.perf_counter()
    model.warm_up()
    warmed = time.perf_counter() - began
    prompt = min(300, model.neuron_config.sequence_length // 2)
    tokens = prompt_ids(prompt, model.args.vocab_size)
    logits = model.prefill(0, tokens)
    decoded = model.decode([0], [int(logits.argmax())], [prompt])
    return {
        "from_pretrained_seconds": loaded,
        "warm_up_seconds": warmed,
        "prefill_logits_head": [round(float(x), 6) for x in logits.flatten()[:8]],
        "decode": repr(decoded),
    }


def in_fresh_process(artifact: Path) -> dict:
    cmd = [sys.executable, __file__, "--one", str(artifact)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", type=Path, nargs="*")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    add_out(parser, "program-load")
    args = parser.parse_args()
    if args.one:
        print(json.dumps({**load_programs(args.one), **load_model(args.one)}))
        return
    if not args.artifacts:
        parser.error("give at least one ARTIFACT")
    rounds = [{a.name: in_fresh_process(a) for a in args.artifacts} for _ in range(args.rounds)]
    lines = [
        "| artifact | round | programs s (recompiles) | from_pretrained s | warm_up s |",
        "|---|---:|---:|---:|---:|",
    ]
    for i, found in enumerate(rounds, 1):
        for name, row in found.items():
            lines.append(
                f"| {name} | {i} | {row['load_seconds']:.2f} ({row['recompiles']}) "
                f"| {row['from_pretrained_seconds']:.2f} | {row['warm_up_seconds']:.2f} |"
            )
    outputs = {(tuple(row["prefill_logits_head"]), row["decode"]) for row in rounds[0].values()}
    lines += ["", f"Same prefill logits and decode output on every artifact: {len(outputs) == 1}"]
    print("\n".join(lines))
    write_json(args.out, "program_load.json", {"rounds": rounds, "same_outputs": len(outputs) == 1}, "program_load")
    (args.out / "program_load.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
