"""The exported directory: what is in it, how it is written and how it is checked on load."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import NEURON_CONFIG_FILE, NeuronConfig, NeuronConfigError
from .errors import ArtifactError
from .models.args import ModelArgs, UnsupportedModelError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(neuron_config: NeuronConfig) -> torch.dtype:
    return DTYPES[neuron_config.torch_dtype]


def cache_dtype(neuron_config: NeuronConfig) -> torch.dtype:
    """The KV cache's dtype: FP8 (E4M3) with kv_cache_dtype "fp8", else the model dtype."""
    return torch.float8_e4m3fn if neuron_config.kv_cache_dtype == "fp8" else torch_dtype(neuron_config)


def save_weights(params: dict[str, torch.Tensor], directory: Path) -> None:
    # Sorted names and no metadata: the same model always gives byte-identical weights.
    save_file({name: params[name].contiguous() for name in sorted(params)}, str(Path(directory) / WEIGHTS_FILE))


def load_weights(directory: Path, names: list[str]) -> dict[str, torch.Tensor]:
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise ArtifactError(f"{path}: missing; export the model again")
    try:
        params = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise ArtifactError(f"{path}: unreadable or truncated ({error}); export the model again") from None
    missing = [n for n in names if n not in params]
    if missing:
        raise ArtifactError(f"{path}: missing tensor(s) {', '.join(missing[:3])}; export the model again")
    return {n: params[n] for n in names}


def save_config(hf_config: dict, directory: Path) -> None:
    (Path(directory) / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2, sort_keys=True, default=str) + "\n")


def load_config(directory: Path) -> tuple[dict, ModelArgs]:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ArtifactError(f"{path}: missing; is {directory} a directory written by `optimum-cli export neuron`?")
    try:
        hf_config = json.loads(path.read_text())
        return hf_config, ModelArgs.from_hf_config(hf_config)
    except (json.JSONDecodeError, KeyError, UnsupportedModelError) as error:
        raise ArtifactError(f"{path}: invalid ({error}); export the model again") from None


def load_neuron_config(directory: str | Path) -> NeuronConfig:
    """The artifact's NeuronConfig; ArtifactError when `directory` is not an export or its file is not readable."""
    if not (Path(directory) / NEURON_CONFIG_FILE).is_file():
        raise ArtifactError(
            f"{str(directory)!r} is not an exported model directory (no {NEURON_CONFIG_FILE}): export it first, "
            f"e.g. `optimum-cli export neuron --model <hf model> <output dir>`, then load or serve <output dir>"
        )
    try:
        return NeuronConfig.load(directory)
    except NeuronConfigError as error:
        raise ArtifactError(str(error)) from None


__all__ = ["NEURON_CONFIG_FILE", "load_config", "load_neuron_config", "load_weights", "save_config", "save_weights"]
