"""What LoRA slots cost at export, per slot count N and rank R: the export time and each graph's operations of one
shape exported without slots and with --max-loras N --max-lora-rank R (every projection), one after the other in
one process after an untimed warm-up export, with no compile cache (every graph traced again). Ratios to the export
without slots printed.

    .venv/bin/python benchmark/graph_cases/lora_export.py [--model GGUF] [--loras 0:0,1:8,4:16,4:64,16:16]

The operations are the call_function nodes of each exported program: what the compiler (torch.export here,
neuronx-cc on Neuron) is handed. N and R are shapes of the slot inputs, so they change the gathers' and the products'
sizes but not the operation count. Writes export.json into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from common import add_out, default_model, write_json


def operations(directory: Path) -> dict[str, int]:
    """Each saved graph's call_function node count, by graph key."""
    from optimum_neuron_plugin.backends.cpu_serde import load_program

    counts = {}
    for path in sorted((directory / "graphs").glob("*.pt2")):
        program = load_program(path)
        counts[path.name.removesuffix(".pt2")] = sum(node.op == "call_function" for node in program.graph.nodes)
    return counts


def export_once(model: Path, args: argparse.Namespace, loras: int, rank: int) -> dict:
    from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM

    config = NeuronConfig(
        batch_size=args.batch_size, sequence_length=args.sequence_length, prefill_chunk_size=args.chunk,
        context_buckets=tuple(int(b) for b in args.context_buckets.split(",")), max_loras=loras,
        max_lora_rank=rank,  # lora_target_modules left at its default: every projection
    )  # fmt: skip
    began = time.perf_counter()
    exported = NeuronModelForCausalLM.export(str(model), config)
    seconds = time.perf_counter() - began
    with tempfile.TemporaryDirectory() as out:
        exported.save_pretrained(out)
        counts = operations(Path(out))
    return {"max_loras": loras, "max_lora_rank": rank, "export_seconds": round(seconds, 2), "operations": counts}


def with_ratios(rows: list[dict], projections: int) -> list[dict]:
    base = rows[0]
    for row in rows[1:]:
        added = {key: row["operations"][key] - count for key, count in base["operations"].items()}
        row["export_time_ratio"] = round(row["export_seconds"] / base["export_seconds"], 3)
        row["operations_ratio"] = round(sum(row["operations"].values()) / sum(base["operations"].values()), 3)
        row["operations_added_per_projection"] = {key: n / projections for key, n in added.items()}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a .gguf or HF directory (default: SmolLM2)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--sequence-length", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--context-buckets", default="512")
    parser.add_argument("--loras", default="0:0,1:8,4:16,4:64,16:16", help="N:R pairs, the first without slots")
    add_out(parser, "lora-export")
    args = parser.parse_args()
    model = args.model or default_model()
    pairs = [tuple(int(v) for v in pair.split(":")) for pair in args.loras.split(",")]
    if pairs[0] != (0, 0):
        parser.error("--loras starts with 0:0, the export without slots every ratio is taken against")
    # Every graph traced, none copied; graphs.py --in-process runs later cases in this process with the cache.
    cache = os.environ.pop("ONP_CPU_COMPILE_CACHE", None)
    try:
        export_once(model, args, 0, 0)  # warm-up: the first export in a process also pays for imports and traces
        rows = [export_once(model, args, loras, rank) for loras, rank in pairs]
    finally:
        if cache is not None:
            os.environ["ONP_CPU_COMPILE_CACHE"] = cache
    from optimum_neuron_plugin.config import LORA_TARGETS
    from optimum_neuron_plugin.models import lora
    from optimum_neuron_plugin.sources import read_config

    projections = lora.projection_count(read_config(model)[1], LORA_TARGETS)
    result = {"model": str(model), "shape": vars(args) | {"out": None, "model": None}, "projections": projections}
    result["exports"] = with_ratios(rows, projections)
    print(json.dumps(result, indent=2, default=str))
    write_json(args.out, "export.json", result, "lora_export")


if __name__ == "__main__":
    main()
