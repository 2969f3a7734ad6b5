"""Model sources: a local Hugging Face directory, a .gguf file, or a hub model id, read through transformers."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ExportError
from .models.args import ModelArgs, UnsupportedModelError
from .models.checkpoint import decoder_weights
from .models.fp8_checkpoint import UnsupportedQuantizationError, checkpoint_format, fp8_state

# Families whose prompts must start with <bos>: without it they degenerate (Gemma repeats one word). Their own
# tokenizers add it; the one transformers builds from a GGUF does not.
_NEEDS_BOS = ("Gemma3ForCausalLM",)


@dataclass
class Source:
    hf_config: dict
    args: ModelArgs
    state_dict: dict[str, torch.Tensor]
    tokenizer: object | None
    generation_config: object | None


@contextmanager
def gguf_read_once() -> Iterator[None]:
    """Within the block each GGUF file is parsed once: transformers otherwise parses a GGUF's metadata for its config,
    again for its weights and again for its tokenizer, seconds of CPU each for a large vocabulary."""
    try:
        import gguf
    except ImportError:  # transformers then refuses GGUF files itself
        yield
        return
    parse = gguf.GGUFReader
    readers: dict[tuple[str, str], object] = {}

    def read(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = parse(path, mode)
        return readers[key]

    gguf.GGUFReader = read
    try:
        yield
    finally:
        gguf.GGUFReader = parse


def _location(model: str | Path) -> tuple[str, dict]:
    path = Path(model)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ExportError(f"model file {path} does not exist")
        return str(path.parent), {"gguf_file": path.name}
    if path.exists():
        if not (path / "config.json").is_file():
            raise ExportError(f"{path} is not a Hugging Face model directory (no config.json) nor a .gguf file")
        return str(path), {}
    if str(model).startswith((".", "/")) or str(model).count("/") > 1:
        raise ExportError(f"model {model} does not exist (expected a model directory, a .gguf file or a hub id)")
    return str(model), {}


def read_config(model: str | Path) -> tuple[dict, ModelArgs]:
    """The model's Hugging Face config and ModelArgs, without loading weights (fails fast)."""
    from transformers import AutoConfig

    location, kwargs = _location(model)
    try:
        config = AutoConfig.from_pretrained(location, **kwargs)
    except Exception as error:  # noqa: BLE001 - any reader failure (struct.error on a truncated GGUF, ...)
        raise ExportError(f"cannot read model {model}: {_first_line(error)}") from None
    hf_config = config.to_dict()
    try:
        return hf_config, ModelArgs.from_hf_config(hf_config)
    except UnsupportedModelError as error:
        raise ExportError(f"model {model}: {error}") from None


def load_source(model: str | Path) -> Source:
    with gguf_read_once():
        return _load_source(model)


def _load_source(model: str | Path) -> Source:
    from transformers import AutoModelForCausalLM, GenerationConfig

    hf_config, args = read_config(model)
    location, kwargs = _location(model)
    try:
        quantized = checkpoint_format(hf_config)
    except UnsupportedQuantizationError as error:
        raise ExportError(f"model {model}: {error}") from None
    if quantized:
        state_dict = _fp8_weights(model, location, args)
    else:
        try:
            hf_model = AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32, **kwargs)
        except Exception as error:  # noqa: BLE001 - truncated safetensors, corrupt GGUF tensors, ...
            raise ExportError(f"cannot load the weights of {model}: {_first_line(error)}") from None
        state_dict = decoder_weights({k: v.detach().contiguous() for k, v in hf_model.state_dict().items()}, args)
        hf_config = hf_model.config.to_dict()
    tokenizer = _load_tokenizer(model, location, kwargs)
    if tokenizer is not None and args.architecture in _NEEDS_BOS:
        _add_bos(tokenizer, model)
    try:
        generation_config = GenerationConfig.from_pretrained(location, **kwargs)
    except (OSError, ValueError, TypeError):
        generation_config = None
    return Source(hf_config, args, state_dict, tokenizer, generation_config)


def _fp8_weights(model: str | Path, location: str, args: ModelArgs) -> dict[str, torch.Tensor]:
    """An FP8 checkpoint's tensors read as they are stored (transformers would dequantize them, or need a GPU):
    FP8 weights with their scales (models/fp8_checkpoint.py), the rest in its own dtype."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    index = Path(location) / "model.safetensors.index.json"
    if index.is_file():  # the sharded checkpoint's files only (Mistral's releases also hold consolidated.safetensors)
        files = sorted({Path(location) / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(Path(location).glob("*.safetensors"))
    if not files:
        raise ExportError(f"model {model}: an FP8 checkpoint is read from a local directory of .safetensors files")
    raw: dict[str, torch.Tensor] = {}
    try:
        for path in files:
            raw |= load_file(str(path))
        return decoder_weights(fp8_state(raw, args), args)
    except (SafetensorError, OSError) as error:
        raise ExportError(f"cannot load the weights of {model}: {_first_line(error)}") from None
    except UnsupportedQuantizationError as error:
        raise ExportError(f"model {model}: {error}") from None


# Files a Hugging Face tokenizer is read from: a model directory with none of them has no tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _load_tokenizer(model: str | Path, location: str, kwargs: dict):
    """The model's tokenizer, exported with the artifact for vLLM to serve text. A model directory without
    tokenizer files exports without one (served with token ids: vLLM's skip_tokenizer_init); a tokenizer that
    exists but does not load fails the export, as vLLM could not serve the artifact."""
    from transformers import AutoTokenizer

    directory = Path(location)
    if "gguf_file" not in kwargs and directory.is_dir() and not any((directory / f).exists() for f in _TOKENIZER_FILES):
        return None
    try:
        return AutoTokenizer.from_pretrained(location, **kwargs)
    except Exception as error:  # noqa: BLE001 - a corrupt file, a missing dependency (sentencepiece, tiktoken), ...
        raise ExportError(
            f"cannot load the tokenizer of {model}: {_first_line(error)} (vLLM needs it to serve the artifact): repair "
            "the tokenizer files or install the package they need, then export again"
        ) from None


def _add_bos(tokenizer, model: str | Path) -> None:
    """Makes the tokenizer prepend <bos> to every prompt (the exported tokenizer.json keeps it)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        raise ExportError(f"model {model}: its tokenizer has no <bos> token, which this architecture needs")
    if tokenizer("a")["input_ids"][:1] != [bos]:
        tokenizer.add_bos_token = True
    if tokenizer("a")["input_ids"][:1] != [bos]:
        raise ExportError(f"model {model}: cannot make its tokenizer ({type(tokenizer).__name__}) add <bos>")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
