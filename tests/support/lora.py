"""Random-weight PEFT LoRA adapters of a tiny model, made by the tests (never committed)."""

from __future__ import annotations

import copy
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
