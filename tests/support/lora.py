"""Random-weight PEFT LoRA adapters of a model, made by the tests (never committed)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(hf, directory: Path, seed: int, rank: int, targets: list[str], alpha: int | None = None, **config):
    """A PEFT adapter of `hf` with random A and B (scale 0.3: each adapter changes the greedy tokens of a tiny model,
    never blows them up), saved in `directory`; returns the peft model in eval mode (the reference)."""
    import peft

    torch.manual_seed(seed)
    lora = peft.LoraConfig(
        r=rank, lora_alpha=alpha or 2 * rank, target_modules=targets, init_lora_weights=False, **config
    )
    model = peft.get_peft_model(copy.deepcopy(hf), lora)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "lora_" in name:
                tensor.copy_(torch.randn_like(tensor) * 0.3)
    model.save_pretrained(directory)
    return model.eval()


@dataclass(frozen=True)
class AdapterSpec:
    """One random adapter of make_adapters: its seed, rank, targets and the std of its A and B entries."""

    seed: int
    rank: int
    targets: list[str]
    scale: float
    use_rslora: bool = False


def make_adapters(hf, root: Path, specs: dict[str, AdapterSpec]):
    """Random PEFT adapters of `hf` (modified in place: one copy of a real model's weights, not one per adapter),
    each saved in root/<name>; returns the PeftModel holding them all, in eval mode: its reference for adapter
    `name` is set_adapter(name), the base model's is `with model.disable_adapter()`."""
    import peft

    model = None
    for name, spec in specs.items():
        config = peft.LoraConfig(
            r=spec.rank, lora_alpha=2 * spec.rank, target_modules=spec.targets, use_rslora=spec.use_rslora
        )
        if model is None:
            model = peft.get_peft_model(hf, config, adapter_name=name)
        else:
            model.add_adapter(name, config)
        torch.manual_seed(spec.seed)
        with torch.no_grad():
            for key, tensor in model.named_parameters():
                if f".{name}." in key and "lora_" in key:
                    tensor.copy_(torch.randn_like(tensor) * spec.scale)
    model.save_pretrained(root)  # adapter `name` in root/name
    return model.eval()
