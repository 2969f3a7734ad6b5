"""Tiny random-weight Hugging Face models (built offline, fixed seeds, fp32) and their exported artifacts.

One shape for every test: 2 layers (layer 1's K/V depend on layer 0's attention, so masking mistakes show in
the cache), GQA with 4 heads over 2 KV heads, hidden size 64. initializer_range 0.1 (HF's default is 0.02)
keeps greedy choices far from ties. Directories are written atomically, so an interrupted build is never reused.
"""

from __future__ import annotations

import gc
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.1,
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
# Gemma 3 with every feature away from its default: a sliding layer then a full one, a window of 6 (shorter than
# a chunk plus the window, so chunks and decode steps read a window of the cache), each kind its own rope base,
# head_dim 32, a query_pre_attn_scalar that is not head_dim, the final logit softcapping.
GEMMA3 = dict(
    layer_types=["sliding_attention", "full_attention"],
    sliding_window=6,
    head_dim=32,
    query_pre_attn_scalar=24,
    final_logit_softcapping=5.0,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
)
GRANITE = dict(
    embedding_multiplier=3.0, attention_multiplier=0.3, residual_multiplier=0.5, logits_scaling=2.0,
    tie_word_embeddings=True,
)  # fmt: skip
# Mixture of experts: 8 experts of MLP size 32, 2 per token (k = 1 and k = 8 are tested by overriding it).
MOE = dict(num_local_experts=8, num_experts_per_tok=2)
QWEN3_MOE = dict(MOE, moe_intermediate_size=32, norm_topk_prob=True, head_dim=32, tie_word_embeddings=False)
MIXTRAL = dict(MOE, intermediate_size=32, tie_word_embeddings=False)
# gpt-oss: a sliding layer (window 6) then a full one, YaRN rope with small original positions (the ramp between
# interpolated and kept frequencies falls inside head_dim 32), the clamped SwiGLU at a limit the tiny activations reach.
GPT_OSS = dict(
    MOE, intermediate_size=32, head_dim=32, sliding_window=6, swiglu_limit=0.3, tie_word_embeddings=False,
    layer_types=["sliding_attention", "full_attention"],
    rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 32,
    },
)  # fmt: skip
# Architecture name -> (config class, model class, what differs from COMMON).
ARCHITECTURES: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel], dict]] = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=True, rms_norm_eps=1e-5)),
    "llama3": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(tie_word_embeddings=False)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=False, rms_norm_eps=1e-6)),
    # head_dim 32 != hidden_size / heads (16): q/k/v projections are not square.
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=False, head_dim=32)),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, dict(GEMMA3)),
    # Every multiplier away from 1 (embedding, attention, residual, logits).
    "granite": (GraniteConfig, GraniteForCausalLM, dict(GRANITE)),
    # Fused qkv_proj and gate_up_proj (split on load).
    "phi3": (Phi3Config, Phi3ForCausalLM, dict(tie_word_embeddings=False)),
    # No rope on every second layer (every 4th in the real models: 2 layers here).
    "smollm3": (SmolLM3Config, SmolLM3ForCausalLM, dict(no_rope_layer_interval=2, tie_word_embeddings=True)),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(QWEN3_MOE)),
    "mixtral": (MixtralConfig, MixtralForCausalLM, dict(MIXTRAL)),
    "gpt_oss": (GptOssConfig, GptOssForCausalLM, dict(GPT_OSS)),
}


def quick_first(names, quick: tuple[str, ...] = ("llama",)) -> list:
    """`names` as pytest parameters, all but `quick` marked slow: the quick loop (-m "not slow") runs a
    per-architecture test on `quick`, the whole suite on every name."""
    return [pytest.param(name, marks=() if name in quick else pytest.mark.slow, id=name) for name in names]


def tiny_model(architecture: str = "llama", seed: int = 0, tokenizer=None, **overrides) -> PreTrainedModel:
    """A tiny random model in eval mode. With a tokenizer, its vocabulary and special ids; without one, no
    bos/eos/pad (greedy generation never stops early, in HF or here) and `vocab_size` from overrides."""
    config_cls, model_cls, extra = ARCHITECTURES[architecture]
    special = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if tokenizer is not None:
        special = dict(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**COMMON, **extra, **special, **overrides})).eval()
    _randomize_biases_and_norms(model)
    model.generation_config.pad_token_id = model.config.pad_token_id or 0
    return model


@torch.no_grad()
def _randomize_biases_and_norms(model: PreTrainedModel) -> None:
    """HF initialises biases to 0 and norm weights to 1: a graph that dropped either would still match HF."""
    std = model.config.initializer_range
    for name, param in model.named_parameters():
        if name.endswith((".bias", "_bias", ".sinks")):
            param.normal_(0.0, std)
        elif "norm" in name:
            param.copy_(1.0 + std * torch.randn_like(param))


def build_atomically(target: Path, build: Callable[[Path], object]) -> Path:
    """Runs build(staging) in a temporary sibling of target and renames it; an existing target is reused."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def save_tiny(directory: Path, architecture: str = "llama", seed: int = 0, tokenizer=None, **overrides) -> Path:
    """tiny_model(...) written with save_pretrained (and its tokenizer), once."""

    def build(staging: Path) -> None:
        tiny_model(architecture, seed, tokenizer, **overrides).save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)

    return build_atomically(directory, build)


# Exports made in this test session, by (source files' digest, NeuronConfig fields): an identical export asked for
# again under another directory is a copy (the same tiny checkpoint is exported with the same shape by several
# test directories).
_EXPORTED: dict[tuple[str, tuple], Path] = {}


def export(source: Path, directory: Path, **neuron_config) -> Path:
    """The export of `source` with NeuronConfig(**neuron_config), written with save_pretrained, once."""
    key = (_digest(Path(source)), tuple(sorted(neuron_config.items())))
    done = _EXPORTED.get(key)

    def build(staging: Path) -> None:
        if done is not None and done.is_dir():
            shutil.copytree(done, staging, dirs_exist_ok=True)
            return
        model = NeuronModelForCausalLM.export(str(source), NeuronConfig(**neuron_config))
        model.save_pretrained(staging)
        del model
        gc.collect()

    _EXPORTED[key] = build_atomically(directory, build)
    return _EXPORTED[key]


def _digest(source: Path) -> str:
    """The digest of a checkpoint directory's files (tiny: a few MB), or of a single file's path."""
    if not source.is_dir():
        return str(source.resolve())
    digest = hashlib.sha256()
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(source)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def export_chain_model(
    directory: Path, tokenizer, embedding_rows: int, trap: int, bad: int, positions: int = 128, **neuron_config
) -> tuple[Path, PreTrainedModel]:
    """An export whose greedy next token is (t + 1) % embedding_rows after any token t but `trap`, after which
    it is `bad`: an id beyond its embedding table (embedding_rows rows; lm_head has len(tokenizer) rows).

    Every layer's output projections are zero, so the last hidden state is the current token's embedding and
    lm_head row j is (a multiple of) the normalised embedding of j's predecessor. A request that reaches
    `trap` samples `bad`, and the next graph call that embeds it (token_generation) raises IndexError: a real
    run-time failure of the decode graph, triggered by the prompt. Hugging Face cannot load a checkpoint
    whose tables differ in size, so the HF directory is whole and the embedding is cut on its way into the
    export. `positions`: the model's max_position_embeddings (the chain does not depend on positions). Returns the
    artifact and the HF model (the reference: it agrees on every id below embedding_rows).
    """
    from unittest import mock

    from optimum_neuron_plugin import sources

    model = tiny_model(
        "llama", seed=7, tokenizer=tokenizer, tie_word_embeddings=False, max_position_embeddings=positions
    )
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight[:embedding_rows]
        unit = embeddings / embeddings.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # the pad row is zero
        head = model.lm_head.weight
        head.zero_()
        head[torch.arange(1, embedding_rows + 1) % embedding_rows] = unit
        head[bad] = 2 * unit[trap]
    source = save_tiny_from(directory.parent / f"{directory.name}-hf", model, tokenizer)
    real_load_source = sources.load_source

    def cut_embedding(path):
        loaded = real_load_source(path)
        table = loaded.state_dict["model.embed_tokens.weight"]
        loaded.state_dict["model.embed_tokens.weight"] = table[:embedding_rows].contiguous()
        return loaded

    with mock.patch.object(sources, "load_source", cut_embedding):
        return export(source, directory, **neuron_config), model


def save_tiny_from(directory: Path, model: PreTrainedModel, tokenizer=None) -> Path:
    """A model (and tokenizer) written with save_pretrained, once."""

    def build(staging: Path) -> None:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)

    return build_atomically(directory, build)
