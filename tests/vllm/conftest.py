"""Session fixtures for the vLLM plugin tests.

ONP_BACKEND=cpu must be set before vLLM resolves its platform (at its first import in this process).
The in-process engines run vLLM's engine core inside the test process (VLLM_ENABLE_V1_MULTIPROCESSING=0):
seconds to start instead of a minute; the server tests cover vLLM's multi-process path.
"""

from __future__ import annotations

import os

os.environ["ONP_BACKEND"] = "cpu"
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from support.served import (  # noqa: E402
    BATCH_SIZE,
    CHUNK,
    LORA_RANK,
    SEQUENCE_LENGTH,
    SHAPE,
    SPECULATIVE_TOKENS,
    save_served_tiny,
)
from support.tiny_models import export  # noqa: E402
from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: E402


@pytest.fixture(scope="session")
def vllm_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-plugin")


@pytest.fixture(scope="session")
def tiny_hf_dir(vllm_root) -> Path:
    return save_served_tiny(vllm_root / "tiny-hf")


@pytest.fixture(scope="session")
def tiny_hf(tiny_hf_dir) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(tiny_hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(tiny_hf_dir):
    return AutoTokenizer.from_pretrained(tiny_hf_dir)


@pytest.fixture(scope="session")
def chunked_dir(vllm_root, tiny_hf_dir) -> Path:
    """Chunked prefill (16-token chunks), on-device sampling: the production shape."""
    return export(tiny_hf_dir, vllm_root / "chunked", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True)


@pytest.fixture(scope="session")
def prompt_logits_dir(vllm_root, tiny_hf_dir) -> Path:
    """chunked_dir's shape with the prompt_logits graphs (prompt logprobs); only the engines that serve prompt
    logprobs load them (every graph of an artifact is loaded at engine start)."""
    return export(
        tiny_hf_dir, vllm_root / "prompt-logits", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True,
        prompt_logprobs=True,
    )  # fmt: skip


@pytest.fixture(scope="session")
def full_host_dir(vllm_root, tiny_hf_dir) -> Path:
    """One context_encoding graph (no chunks); token_generation returns logits (host sampling, logprobs)."""
    return export(tiny_hf_dir, vllm_root / "full-host", **SHAPE, prefill_chunk_size=0, on_device_sampling=False)


@pytest.fixture(scope="session")
def batched_dir(vllm_root, tiny_hf_dir) -> Path:
    """chunked_dir's shape with prefill_batch_size = batch size: a step's prompt chunks go in one call; and tail
    graphs of half a chunk: a prompt's last piece of at most that many tokens runs on one alone. One context bucket
    (a fraction of the default ladder's 62 graphs: its tests are not about buckets)."""
    return export(
        tiny_hf_dir, vllm_root / "prefill-batch", **SHAPE, prefill_chunk_size=CHUNK, prefill_batch_size=BATCH_SIZE,
        prompt_logprobs=True, prefill_tail_size=CHUNK // 2, context_buckets=(SEQUENCE_LENGTH,),
        prefill_buckets=(0, SEQUENCE_LENGTH),
    )  # fmt: skip


@pytest.fixture(scope="session")
def spec_dir(vllm_root, tiny_hf_dir) -> Path:
    """chunked_dir's shape with verify graphs of SPECULATIVE_TOKENS drafts (speculative decoding)."""
    return export(
        tiny_hf_dir, vllm_root / "speculative", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True,
        speculative_tokens=SPECULATIVE_TOKENS,
    )  # fmt: skip


@pytest.fixture(scope="session")
def tp2_dir(vllm_root, tiny_hf_dir) -> Path:
    """chunked_dir's shape split over 2 ranks (tp_degree 2): vLLM runs one worker per rank. One context bucket (6
    graphs instead of the default ladder's 23: its tests are not about buckets)."""
    return export(
        tiny_hf_dir, vllm_root / "chunked-tp2", **SHAPE, prefill_chunk_size=CHUNK, tp_degree=2,
        context_buckets=(SEQUENCE_LENGTH,), prefill_buckets=(0, SEQUENCE_LENGTH),
    )  # fmt: skip


@pytest.fixture(scope="session")
def lora_dir(vllm_root, tiny_hf_dir) -> Path:
    """The served shape with 2 LoRA slots of rank LORA_RANK (light buckets: its tests are about adapters)."""
    return export(
        tiny_hf_dir, vllm_root / "lora", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True, max_loras=2,
        max_lora_rank=LORA_RANK, context_buckets=(64, 128), prefill_buckets=(0, 64, 128),
    )  # fmt: skip


@pytest.fixture(scope="session")
def lora_adapters(vllm_root, tiny_hf) -> dict:
    """Three random PEFT adapters of the served model (one more than lora_dir's slots): name -> (directory, peft
    reference). "first" targets every projection at rank 4, "second" two at LORA_RANK, "third" every one at rank 2."""
    from support.lora import ALL_TARGETS, make_adapter

    shapes = {"first": (4, ALL_TARGETS), "second": (LORA_RANK, ["q_proj", "down_proj"]), "third": (2, ALL_TARGETS)}
    made = {}
    for seed, (name, (rank, targets)) in enumerate(shapes.items()):
        path = vllm_root / "adapters" / name
        made[name] = (path, make_adapter(tiny_hf, path, seed, rank, targets))
    return made
