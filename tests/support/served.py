"""The tiny model the vLLM and reliability tests serve, its shapes and its prompts.

A 2-layer random Llama with SmolLM2's real tokenizer (from the bundled GGUF), so vLLM's tokenizer, chat
template and detokenizer run for real, with random fp32 weights that make every engine step cheap.
"""

from __future__ import annotations

from pathlib import Path

from .smollm2 import smollm2_tokenizer
from .tiny_models import save_tiny

BATCH_SIZE = 4
SEQUENCE_LENGTH = 128
CHUNK = 16
SPECULATIVE_TOKENS = 3  # the draft tokens of spec_dir's verify graphs (tests/vllm/conftest.py)
SHAPE = dict(batch_size=BATCH_SIZE, sequence_length=SEQUENCE_LENGTH)
LORA_RANK = 8  # the LoRA export's max_lora_rank (tests/vllm/conftest.py lora_dir), 2 slots

# Words whose tokens make prompts of exact lengths (SmolLM2 tokenizer).
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
]


def prompt_of(num_tokens: int, tokenizer, offset: int = 0) -> list[int]:
    """A token prompt of exactly num_tokens tokens (token ids of repeated words)."""
    ids = tokenizer(" ".join(WORDS[(offset + i) % len(WORDS)] for i in range(num_tokens))).input_ids
    return ids[:num_tokens]


def save_served_tiny(directory: Path) -> Path:
    """The served tiny Llama (untied, 256 positions) with SmolLM2's tokenizer, saved once."""
    if (directory / "config.json").is_file():
        return directory
    return save_tiny(
        directory,
        "llama",
        seed=0,
        tokenizer=smollm2_tokenizer(),
        tie_word_embeddings=False,
        max_position_embeddings=256,
    )
