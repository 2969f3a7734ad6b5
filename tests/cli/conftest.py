"""Fixtures for the CLI tests: tiny random-weight models built offline.

The tiny models use the SmolLM2 tokenizer (read from the bundled GGUF, ~15 s) and are cached in pytest's cache
directory (.pytest_cache/d/cli-fixtures-v*), so only the first run pays for building them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.smollm2 import smollm2_tokenizer
from support.tiny_models import build_atomically

FIXTURE_VERSION = 1


# Tiny configurations: 2 layers, 4 heads / 2 kv heads (tensor parallel 1, 2 and 4 are valid, 3 is not),
# 128 positions. initializer_range 0.1 (HF default 0.02) keeps greedy choices far from ties.
TINY = {
    "llama": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        tie_word_embeddings=True,
    ),
    "qwen2": dict(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        tie_word_embeddings=False,
    ),
    # Not supported by the plugin: the exporter must name the supported architectures.
    "gpt2": dict(
        architectures=["GPT2LMHeadModel"],
        model_type="gpt2",
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=128,
        initializer_range=0.1,
    ),
}


def _fixture_root(config: pytest.Config) -> Path:
    return Path(config.cache.mkdir(f"cli-fixtures-v{FIXTURE_VERSION}"))


@pytest.fixture(scope="session")
def tokenizer_dir(pytestconfig) -> Path:
    def build(directory: Path) -> None:
        smollm2_tokenizer().save_pretrained(directory)

    return build_atomically(_fixture_root(pytestconfig) / "smollm2-tokenizer", build)


def _build_tiny(name: str, tokenizer_dir: Path, directory: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    values = dict(TINY[name])
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **values,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


@pytest.fixture(scope="session")
def tiny_models(pytestconfig, tokenizer_dir) -> dict[str, Path]:
    root = _fixture_root(pytestconfig)
    return {
        name: build_atomically(root / f"tiny-{name}", lambda d, n=name: _build_tiny(n, tokenizer_dir, d))
        for name in TINY
    }


@pytest.fixture
def tiny_llama(tiny_models) -> Path:
    return tiny_models["llama"]
