"""What LoRA rows cost: on one export with adapter slots (SmolLM2, --max-loras 4 --max-lora-rank 16, every
projection), calls whose rows run adapters against the same calls with every row on the base model (slot 0); the
slots' cost when no row uses them (the same export's base rows against an export without slots); and the time to
load an adapter while serving. Same process, same threads, timings alternated, ratios printed.

    .venv/bin/python benchmark/graph_cases/lora.py [--threads 1] [--context 300] [--max-loras 4] [--max-lora-rank 16]

Exports SmolLM2 twice (cached under benchmark/results/artifacts/): with the slots, and without. The adapters are
random, written in PEFT's file layout (adapter_config.json, adapter_model.safetensors) at --max-lora-rank into a
temporary directory; their values do not matter to the timing. Measures at --context positions:
- decode: a token_generation call of batch_size rows, each row on its own adapter against every row on the base
  model; decode_1: one row likewise;
- chunk: one chunked_prefill call (a --chunk token chunk at --context, or as late as the sequence length allows)
  on an adapter against the base model;
- slots_decode / slots_chunk: the export with slots, base rows, against the export without slots;
- load: load_adapter of a PEFT directory (read + checks + copy into a slot) and of an adapter already read (the
  copy alone: what a swap from vLLM's host cache costs), median over --repeats loads (each unloaded after).
Writes lora.json into --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import (
    ARTIFACTS,
    ab_artifact_name,
    ab_parser,
    add_out,
    alternate,
    default_model,
    export_variant,
    prompt_ids,
    write_json,
)

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(model, directory: Path, rank: int, seed: int) -> Path:
    """A random LoRA adapter of `model`'s base model at `rank` on every projection, in PEFT's file layout."""
    from safetensors.torch import save_file

    from optimum_neuron_plugin.models import lora

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(model.args.num_hidden_layers):
        for target in lora.targets(model.args, layer, TARGETS):
            fan_in, fan_out = lora.shape(model.args, target)
            key = f"base_model.model.{lora.projection(layer, target)}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * 0.02
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * 0.02
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS)}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def measure(with_slots: Path, without: Path, adapters: Path, args: argparse.Namespace) -> dict:
    from optimum_neuron_plugin import NeuronModelForCausalLM
    from optimum_neuron_plugin.sampling import SamplingParams

    models = {
        "lora": NeuronModelForCausalLM.from_pretrained(with_slots),
        "plain": NeuronModelForCausalLM.from_pretrained(without),
    }
    model, batch = models["lora"], args.batch_size
    paths = [write_adapter(model, adapters / f"adapter-{i}", args.max_lora_rank, i) for i in range(args.max_loras)]
    names = [f"adapter-{i}" for i in range(args.max_loras)]
    for name, path in zip(names, paths, strict=True):
        model.load_adapter(name, path)
    tokens = prompt_ids(args.context + args.chunk, model.args.vocab_size)
    for each in models.values():
        for seq in range(batch):
            each.prefill(seq, tokens[: args.context])
    hot = SamplingParams(top_k=50, top_p=0.9, temperature=0.8)

    def rows_on(on_adapters: bool, rows: int) -> None:
        for seq in range(batch - rows, batch):
            model.set_adapter(seq, names[seq % len(names)] if on_adapters else None)

    def decode(name: str, rows: int, on_adapters: bool = False):
        seqs = list(range(batch - rows, batch))

        def call():
            if name == "lora":
                rows_on(on_adapters, rows)
            models[name].decode(seqs, [7] * rows, [args.context] * rows, [hot] * rows)

        return call

    start = min(args.context, args.sequence_length - args.chunk)  # the chunk's first position

    def chunk(name: str, on_adapters: bool = False):
        def call():
            if name == "lora":
                model.set_adapter(0, names[0] if on_adapters else None)
            models[name].prefill(0, tokens[start : start + args.chunk], start=start)

        return call

    figures = {
        "decode": alternate(decode("lora", batch, True), decode("lora", batch), args.repeats, ("lora", "base")),
        "decode_1": alternate(decode("lora", 1, True), decode("lora", 1), args.repeats, ("lora", "base")),
        "chunk": alternate(chunk("lora", True), chunk("lora"), args.repeats, ("lora", "base")),
        "slots_decode": alternate(decode("lora", batch), decode("plain", batch), args.repeats, ("slots", "none")),
        "slots_chunk": alternate(chunk("lora"), chunk("plain"), args.repeats, ("slots", "none")),
    }
    rows_on(False, batch)
    figures["load"] = load_times(model, paths[0], args.repeats)
    return figures


def load_times(model, path: Path, repeats: int) -> dict:
    """Median ms of load_adapter from a PEFT directory and from an adapter already read, into a free slot."""
    model.unload_adapter("adapter-0")
    read = model.read_adapter(path)
    times: dict[str, list[float]] = {"from_directory": [], "copy_only": []}
    for _ in range(repeats):
        for kind, source in (("from_directory", path), ("copy_only", read)):
            began = time.perf_counter()
            model.load_adapter("timed", source)
            times[kind].append(time.perf_counter() - began)
            model.unload_adapter("timed")
    return {f"{kind}_ms": statistics.median(values) * 1e3 for kind, values in times.items()}


def main() -> None:
    parser = ab_parser(__doc__)
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--export-only", action="store_true", help="export the artifacts (outside any timing) and stop")
    add_out(parser, "lora")
    args = parser.parse_args()
    model = args.model or default_model()
    torch.set_num_threads(args.threads)
    name = ab_artifact_name(args)
    with_slots = export_variant(
        model, ARTIFACTS / f"{name}-{args.compiler}-lora{args.max_loras}r{args.max_lora_rank}", args,
        max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
    )  # fmt: skip
    without = export_variant(model, ARTIFACTS / f"{name}-{args.compiler}-no-lora", args, max_loras=0)
    if args.export_only:
        return
    with tempfile.TemporaryDirectory(prefix="lora-adapters-") as adapters:
        figures = measure(with_slots, without, Path(adapters), args)
    for key, row in figures.items():
        if key == "load":
            print(f"[lora] load_adapter     from a directory {row['from_directory_ms']:8.2f} ms   "
                  f"copy only {row['copy_only_ms']:8.2f} ms")  # fmt: skip
            continue
        (first, a), (second, b) = ((k.removesuffix("_ms"), v) for k, v in row.items() if k.endswith("_ms"))
        print(f"[lora] {key:<16} {first} {a:8.2f} ms   {second} {b:8.2f} ms   ratio {row['ratio']:.3f}x")
    results = {
        "threads": args.threads, "context": args.context, "compiler": args.compiler, "artifact": name,
        "max_loras": args.max_loras, "max_lora_rank": args.max_lora_rank, "repeats": args.repeats, **figures,
    }  # fmt: skip
    write_json(args.out, "lora.json", results, "lora")


if __name__ == "__main__":
    main()
