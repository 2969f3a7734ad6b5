"""vllm.LLM in the test process (the caller's conftest sets ONP_BACKEND=cpu before vLLM is imported)."""

from __future__ import annotations

import gc
from pathlib import Path


def make_llm(model: Path, **kwargs):
    from vllm import LLM

    return LLM(model=str(model), seed=0, **kwargs)


def close_llm(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
