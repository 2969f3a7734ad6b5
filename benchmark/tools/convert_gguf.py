"""Convert a GGUF checkpoint into a Hugging Face safetensors directory (weights dequantized to float32).

    .venv/bin/python benchmark/tools/convert_gguf.py MODEL.gguf OUT

The peers (vLLM's own CPU backend, transformers generate) load this directory: the same weights the
plugin's exporter reads from the GGUF. Written beside OUT and renamed into place, so an interrupted
conversion is never reused.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path


def convert(gguf: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The weights are dequantized on load, but the model stays marked as GGUF-quantized, which
        # save_pretrained refuses: copy them into a plain model built from the same configuration.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print(convert(args.gguf.resolve(), args.out))


if __name__ == "__main__":
    main()
