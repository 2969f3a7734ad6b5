"""What the tests check an exported artifact with: its recorded options, and its greedy tokens against HF's (plain
forward passes, so that no generation config of the model changes them), up to an end-of-sequence token."""

from __future__ import annotations

import json
from pathlib import Path

PROMPT = (
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest where nobody "
    "can find it. Later that evening, the farmer walks out to the field and counts his sheep twice."
)
NEW_TOKENS = 12


def hf_greedy(model, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding with plain forward passes (no generation-config surprises)."""
    import torch

    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        for _ in range(new_tokens):
            next_id = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
    return ids[0, len(prompt_ids) :].tolist()


def plugin_greedy(exported, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Greedy tokens of an export directory (loaded here) or of a loaded model."""
    import torch

    from optimum_neuron_plugin.runtime import NeuronModelForCausalLM

    model = NeuronModelForCausalLM.from_pretrained(exported) if isinstance(exported, Path) else exported
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=[])
    return out[0, len(prompt_ids) :].tolist()


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def assert_same_greedy(exported, hf_model, prompt_ids: list[int], eos: set[int], new_tokens=NEW_TOKENS):
    expected = until_eos(hf_greedy(hf_model, prompt_ids, new_tokens), eos)
    actual = until_eos(plugin_greedy(exported, prompt_ids, new_tokens), eos)
    assert actual == expected


def load_hf(model_dir: Path, **kwargs):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kwargs).eval()


def prompt_ids(model_dir: Path, **kwargs) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, **kwargs)(PROMPT)["input_ids"]


def neuron_config(directory: Path) -> dict:
    return json.loads((directory / "neuron_config.json").read_text())
