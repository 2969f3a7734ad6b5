"""`neuron-plugin-info DIR`: what an exported directory contains (configuration, graphs, files).

Reads the files directly (no graph is loaded), so it is instant and works for a neuron artifact on a CPU host.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MODEL_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)


def _size(num_bytes: int) -> str:
    size = float(num_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing; is this a directory written by `optimum-cli export neuron`?") from None
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: unreadable ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def describe(directory: str | Path) -> list[str]:
    """Lines describing an exported directory. Raises ValueError when it is not one."""
    from optimum_neuron_plugin.config import NeuronConfig

    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: not a directory")
    neuron_config = NeuronConfig.load(directory)
    raw = _read_json(directory / "neuron_config.json")
    config = _read_json(directory / "config.json")

    architecture = ", ".join(config.get("architectures") or []) or config.get("model_type", "?")
    lines = [f"model: {architecture} ({config.get('model_type', '?')})"]
    lines.append("  " + ", ".join(f"{key} {config[key]}" for key in MODEL_KEYS if key in config))
    lines.append("neuron_config:")
    for key, value in neuron_config.to_dict().items():
        lines.append(f"  {key}: {value}")
    extra = {k: v for k, v in sorted(raw.items()) if k not in neuron_config.to_dict()}
    for key, value in extra.items():
        lines.append(f"  {key}: {json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value}")

    lines.append(f"quantization: {_quantization(directory, neuron_config)}")

    from exporter.plan import graph_line
    from optimum_neuron_plugin.backends import get_backend
    from optimum_neuron_plugin.graphs import graph_specs

    specs = graph_specs(neuron_config, int(config.get("vocab_size") or 0))
    lines.append(f"graphs ({len(specs)}):")
    lines.extend(f"  {graph_line(spec)}" for spec in specs)
    lines.extend(_memory_lines(config, neuron_config, raw))
    # One file per graph on the cpu backend; a manifest per graph plus its NEFF cache files on the neuron backend.
    programs = get_backend(neuron_config).graph_files(directory, specs)
    missing = [p for p in programs if not p.is_file()]
    if missing:
        lines.append(f"MISSING compiled program(s): {', '.join(str(p.relative_to(directory)) for p in missing)}")

    files = sorted(p for p in directory.rglob("*") if p.is_file())
    lines.append(f"files ({len(files)}):")
    lines.extend(f"  {p.relative_to(directory)} ({_size(p.stat().st_size)})" for p in files)
    total = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    lines.append(f"total: {_size(total)}")
    chat = _has_chat_template(directory)
    lines.append(f"chat template: {'yes' if chat else 'no'}")
    return lines


def _quantization(directory: Path, neuron_config) -> str:
    """What is FP8 in the artifact, read from the weights file's header (no tensor is loaded)."""
    if neuron_config.quantization is None and neuron_config.kv_cache_dtype is None:
        return "none"
    from safetensors import safe_open

    fp8, layouts = 0, set()
    with safe_open(str(directory / "model.safetensors"), "pt") as weights:
        for name in weights.keys():  # noqa: SIM118 - safe_open is not a mapping
            if weights.get_slice(name).get_dtype() == "F8_E4M3":
                fp8 += 1
            elif name.endswith(".weight_scale"):
                layouts.add(
                    "per output channel" if len(weights.get_slice(name).get_shape()) == 1 else "per 128-column block"
                )
    from optimum_neuron_plugin.models.fp8 import weight_max

    target = neuron_config.target or "cpu"
    parts = []
    if neuron_config.quantization:
        parts.append(
            f"weights {neuron_config.quantization} ({fp8} projections, E4M3 within +-{weight_max(neuron_config.target):g} for {target}, scales {' and '.join(sorted(layouts))})"
        )
    if neuron_config.kv_cache_dtype:
        parts.append(f"KV cache {neuron_config.kv_cache_dtype} (E4M3 within +-240, a K and a V scale per layer)")
    return "; ".join(parts)


def _memory_lines(config: dict, neuron_config, raw: dict) -> list[str]:
    """The memory plan per rank (optimum_neuron_plugin.sizing), at the LNC the graphs were compiled for."""
    from exporter.plan import make_plan
    from optimum_neuron_plugin.models.args import ModelArgs, UnsupportedModelError

    try:
        args = ModelArgs.from_hf_config(config)
    except (UnsupportedModelError, KeyError, TypeError) as error:
        return [f"memory plan: unavailable ({error})"]
    lnc = str((raw.get("compiler") or {}).get("logical_nc_config") or "")
    return make_plan(args, neuron_config, int(lnc) if lnc in ("1", "2") else None).memory.lines()


def _has_chat_template(directory: Path) -> bool:
    if (directory / "chat_template.jinja").is_file() or (directory / "chat_template.json").is_file():
        return True
    path = directory / "tokenizer_config.json"
    if path.is_file():
        try:
            return bool(json.loads(path.read_text()).get("chat_template"))
        except (OSError, json.JSONDecodeError):
            return False
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="neuron-plugin-info",
        description="Print what a directory written by `optimum-cli export neuron` contains (its graphs and memory "
        "plan per rank), or with --check-host whether this host is ready for the neuron backend.",
    )
    parser.add_argument("directory", type=Path, nargs="?", help="an exported model directory")
    parser.add_argument(
        "--check-host",
        action="store_true",
        help="print the versions, NeuronCores, LNC and HBM per core of this host; fail with what to fix",
    )
    args = parser.parse_args(argv)
    if args.check_host:
        from exporter.host_check import main as check_host

        return check_host()
    if args.directory is None:
        parser.error("give an exported model directory, or --check-host")
    try:
        lines = describe(args.directory)
    except (ValueError, OSError) as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    print(f"{args.directory}:")
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
