"""A draft model for speculative decoding benchmarks when no smaller model of the same tokenizer is at hand: the
first N decoder layers of a Hugging Face checkpoint, with its embedding, final norm and head (no training).

Usage: python benchmark/tools/shrunk_draft.py HF_DIR OUT_DIR --layers N; then export OUT_DIR with `optimum-cli export neuron`.
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("hf_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--layers", type=int, required=True)
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32)
    model.model.layers = model.model.layers[: args.layers]
    model.config.num_hidden_layers = args.layers
    model.save_pretrained(args.out_dir)
    AutoTokenizer.from_pretrained(args.hf_dir).save_pretrained(args.out_dir)


if __name__ == "__main__":
    main()
