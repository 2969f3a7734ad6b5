"""What --prompt-logprobs costs at export: the graphs and the export time of one shape with the prompt_logits
graphs against without, exported one after the other in one process (ratio printed).

    .venv/bin/python benchmark/graph_cases/prompt_logits_export.py [--model DIR] [--sequence-length 128] [--chunk 16]

--model defaults to the tests' tiny served model (2 layers, SmolLM2's tokenizer and vocabulary), written to a scratch
directory. Writes export.json into --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from common import add_out, write_json

BENCH = Path(__file__).resolve().parents[1]


def export_seconds(model: Path, args: argparse.Namespace, prompt_logprobs: bool) -> tuple[float, int]:
    from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM

    config = NeuronConfig(
        batch_size=args.batch_size, sequence_length=args.sequence_length, prefill_chunk_size=args.chunk,
        prompt_logprobs=prompt_logprobs,
    )  # fmt: skip
    began = time.perf_counter()
    exported = NeuronModelForCausalLM.export(str(model), config)
    with tempfile.TemporaryDirectory() as out:
        exported.save_pretrained(out)
        graphs = len(list((Path(out) / "graphs").glob("*.pt2")))
    return time.perf_counter() - began, graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=16)
    add_out(parser, "prompt-logits-export")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            sys.path.insert(0, str(BENCH.parent / "tests"))
            from support.served import save_served_tiny

            model = save_served_tiny(Path(scratch) / "tiny")
        without, graphs_without = export_seconds(model, args, False)
        with_graphs, graphs_with = export_seconds(model, args, True)
    result = {
        "model": str(args.model or "tests' tiny served model"),
        "batch_size": args.batch_size,
        "sequence_length": args.sequence_length,
        "chunk": args.chunk,
        "graphs_without": graphs_without,
        "graphs_with": graphs_with,
        "export_seconds_without": round(without, 2),
        "export_seconds_with": round(with_graphs, 2),
        "export_time_ratio": round(with_graphs / without, 3),
    }
    print(json.dumps(result, indent=2))
    write_json(args.out, "export.json", result, "prompt_logits_export")


if __name__ == "__main__":
    main()
