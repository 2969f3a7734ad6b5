"""A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) read into the slot layout of
models/lora.py: per targeted projection A [in, R] and B [R, out], the rank zero-padded to R and the scaling
(lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA) folded into B. Anything the slots cannot hold is refused
with what to change."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ...config import NeuronConfig
from ...errors import InputError
from ...models import lora
from ...models.args import ModelArgs

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT's key of one projection's A or B: [prefix.]model.layers.<i>.<self_attn|mlp>.<target>.lora_<A|B>[.<adapter>].weight
KEY = re.compile(r"(?:.*\.)?(model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+))\.lora_([AB])(?:\.\w+)?\.weight$")


@dataclass(frozen=True)
class Adapter:
    """An adapter in slot layout: projection name -> (A [in, R], B [R, out] scaled), in the full model's shapes."""

    path: Path
    rank: int
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Checked:
    """What check() found: the adapter fits the export; its rank, B's scaling, and the PEFT keys of each projection's
    A and B."""

    rank: int
    scale: float
    keys: dict[str, tuple[str, str]]


def check(path: str | Path, args: ModelArgs, neuron_config: NeuronConfig) -> Checked:
    """Checks the PEFT adapter directory at `path` against the export from its config and its tensors' shapes
    (no weight is read); raises InputError saying what to change."""
    path = Path(path)
    config = _config(path)
    r, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(r, int) or r < 1:
        raise InputError(f"{path / CONFIG_FILE}: r={r!r} is not a LoRA rank")
    nc = neuron_config
    if r > nc.max_lora_rank:
        raise InputError(
            f"{path}: rank {r} exceeds this export's max_lora_rank {nc.max_lora_rank}: export again with "
            f"--max-lora-rank {r} or more"
        )
    _check_options(path, config)
    shapes, dtypes = _header(path)
    pairs: dict[str, dict[str, str]] = {}
    for key in shapes:
        match = KEY.match(key)
        if match is None:
            raise InputError(
                f"{path / WEIGHTS_FILE}: tensor {key} is not a LoRA A/B of a decoder layer's projection; LoRA slots "
                "hold the decoder layers' attention and MLP projections: train the adapter on those only"
            )
        name, layer, target, half = match.group(1), int(match.group(2)), match.group(3), match.group(4)
        _check_target(path, layer, target, args, nc)
        if not dtypes[key].startswith(("F", "BF")):  # safetensors' names: F32, F16, BF16, F8_E4M3, ...; I8, U8, ...
            raise InputError(
                f"{path / WEIGHTS_FILE}: {key} is {dtypes[key]}; LoRA weights are floating point (float32, float16 "
                "or bfloat16): save the adapter unquantized"
            )
        pairs.setdefault(name, {})[half] = key
    keys = {}
    for name, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise InputError(f"{path / WEIGHTS_FILE}: {name} has lora_{''.join(pair)} without its other half")
        fan_in, fan_out = lora.shape(args, name.rsplit(".", 1)[-1])
        a, b = shapes[pair["A"]], shapes[pair["B"]]  # PEFT: A [r, in], B [out, r]
        if a != [r, fan_in] or b != [fan_out, r]:
            raise InputError(
                f"{path}: {name} has A {a} and B {b}, this model's rank-{r} adapter has "
                f"A [{r}, {fan_in}] and B [{fan_out}, {r}]: the adapter was trained for another base model"
            )
        keys[name] = (pair["A"], pair["B"])
    if not keys:
        raise InputError(f"{path / WEIGHTS_FILE}: holds no LoRA weights")
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    return Checked(r, scale, keys)


def read(path: str | Path, args: ModelArgs, neuron_config: NeuronConfig) -> Adapter:
    """The adapter at `path`, checked (check()), in slot layout."""
    path = Path(path)
    checked, rank = check(path, args, neuron_config), neuron_config.max_lora_rank
    tensors = _tensors(path)
    weights = {}
    for name, (a_key, b_key) in checked.keys.items():
        a, b = tensors[a_key], tensors[b_key]  # any float dtype: copied into the slots in the export's dtype
        weights[name] = (_padded(a.T.float(), rank, 1), _padded(b.T.float() * checked.scale, rank, 0))
    return Adapter(path, checked.rank, weights)


def _config(path: Path) -> dict:
    if not path.exists():
        raise InputError(
            f"{path}: no such directory on this host; give the path of a PEFT LoRA adapter directory ({CONFIG_FILE}, "
            f"{WEIGHTS_FILE})"
        )
    if not path.is_dir():
        raise InputError(f"{path}: not a directory; give a PEFT LoRA adapter directory ({CONFIG_FILE}, {WEIGHTS_FILE})")
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except OSError:
        raise InputError(f"{path}: no {CONFIG_FILE}; give a PEFT LoRA adapter directory") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{path / CONFIG_FILE}: not JSON ({error})") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise InputError(f"{path}: peft_type {config.get('peft_type')!r} is not supported: only LoRA adapters load")
    return config


def _check_options(path: Path, config: dict) -> None:
    """PEFT options the slots cannot express."""
    unsupported = {
        "use_dora": "DoRA",
        "rank_pattern": "per-module ranks (rank_pattern)",
        "alpha_pattern": "per-module alphas (alpha_pattern)",
        "modules_to_save": "fully trained modules (modules_to_save)",
        "fan_in_fan_out": "fan_in_fan_out weights",
    }
    for key, what in unsupported.items():
        if config.get(key):
            raise InputError(f"{path}: {what} is not supported by LoRA slots; merge the adapter or train without it")
    if config.get("bias", "none") != "none":
        raise InputError(f"{path}: bias={config['bias']!r} is not supported by LoRA slots (only bias='none')")


def _header(path: Path) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Each tensor's shape and dtype name from the safetensors header (no data read)."""
    from safetensors import SafetensorError, safe_open

    file = _weights_file(path)
    try:
        with safe_open(str(file), "pt") as handle:
            slices = {key: handle.get_slice(key) for key in handle.keys()}  # noqa: SIM118 (a safe_open handle is not a dict)
            return {k: list(v.get_shape()) for k, v in slices.items()}, {k: v.get_dtype() for k, v in slices.items()}
    except (SafetensorError, OSError) as error:
        raise InputError(f"{file}: unreadable ({error})") from None


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = _weights_file(path)
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as error:
        raise InputError(f"{file}: unreadable ({error})") from None


def _weights_file(path: Path) -> Path:
    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise InputError(f"{path}: no {WEIGHTS_FILE} (adapter_model.bin is not read: save with safe_serialization)")
    return file


def _check_target(path: Path, layer: int, target: str, args: ModelArgs, nc: NeuronConfig) -> None:
    if layer >= args.num_hidden_layers:
        raise InputError(
            f"{path}: targets layer {layer}, this model has {args.num_hidden_layers} layers: the adapter was trained "
            "for another base model"
        )
    if target not in lora.targets(args, layer, nc.lora_target_modules):
        raise InputError(
            f"{path}: targets {target} of layer {layer}, this export holds LoRA slots for "
            f"{', '.join(lora.targets(args, layer, nc.lora_target_modules))}: export again with "
            f"--lora-target-modules including {target}"
        )


def _padded(tensor: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """The rank dimension `dim` zero-padded to `size`."""
    pad = size - tensor.shape[dim]
    if not pad:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = pad
    return torch.cat((tensor, tensor.new_zeros(shape)), dim=dim)
