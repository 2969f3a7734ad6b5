"""Session fixtures for the core tests: the tiny models' exported artifacts, shared by every test module."""

from __future__ import annotations

import pytest
import torch

from .helpers import CHUNKED_LOGITS, CONTEXT_ENCODING, Artifact, Zoo


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> Zoo:
    return Zoo(tmp_path_factory.mktemp("core-zoo"))


@pytest.fixture(scope="session")
def llama_logits(zoo) -> Artifact:
    """Tiny Llama (tied embeddings), chunk 8, batch 3; token_generation returns logits (host sampling)."""
    return zoo.artifact("llama", **CHUNKED_LOGITS)


@pytest.fixture(scope="session")
def llama_context(zoo) -> Artifact:
    """Tiny Llama, no chunking (one 64-token context_encoding graph), batch 3, on-device sampling."""
    return zoo.artifact("llama", **CONTEXT_ENCODING)


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """The tiny models gain nothing from intra-op threads, and on a busy 2-core host a second thread spinning in
    every small op makes each graph call 10-30x slower. Restored when the core tests end."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
