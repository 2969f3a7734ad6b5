"""`vllm serve --data-parallel-size 2` on a tiny Qwen3-MoE export: vLLM runs MoE engines in lock step
(DPEngineCoreProc: a DP process group, an all-reduce of unfinished requests, a dummy batch on an idle engine).

Requests sent one at a time keep one engine idle while the other works: the idle one runs the worker's dummy step
(a real decode call; that it writes no request's K/V is checked on the runtime in test_data_parallel_config.py).
Greedy outputs equal Hugging Face's, with one engine idle and with both busy.
"""

from __future__ import annotations

import pytest
import torch
from support.client import completion_tokens, concurrently, greedy, requests_finished_by_engine
from support.references import hf_greedy
from support.served import CHUNK, SHAPE, prompt_of
from support.server import serve
from support.smollm2 import smollm2_tokenizer
from support.tiny_models import export, save_tiny

pytestmark = pytest.mark.slow  # a live `vllm serve`

NEW_TOKENS = 6
PROMPT_LENGTHS = [7, 20, 35, 11, 26, 4]


@pytest.fixture(scope="module")
def moe_hf_dir(vllm_root):
    return save_tiny(vllm_root / "tiny-moe-hf", "qwen3_moe", tokenizer=smollm2_tokenizer(), max_position_embeddings=256)


@pytest.fixture(scope="module")
def moe_hf(moe_hf_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(moe_hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def server(moe_hf_dir, vllm_root, tmp_path_factory):
    artifact = export(moe_hf_dir, vllm_root / "moe", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True)
    log = tmp_path_factory.mktemp("dp-moe") / "server.log"
    yield from serve(artifact, log, "--data-parallel-size", "2", env={"OMP_NUM_THREADS": "2"}, timeout=900)


def test_moe_engines_in_lock_step_equal_transformers_idle_and_busy(server, moe_hf, tokenizer):
    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate(PROMPT_LENGTHS)]
    expected = [hf_greedy(moe_hf, p, NEW_TOKENS) for p in prompts]
    body = lambda prompt: greedy(server.model, prompt, NEW_TOKENS)  # noqa: E731
    one_at_a_time = [completion_tokens(server.port, body(p)) for p in prompts]
    assert one_at_a_time == expected
    assert "idle data-parallel engine: dummy decode steps" in server.log.read_text()
    assert concurrently(lambda p: completion_tokens(server.port, body(p)), prompts, workers=len(prompts)) == expected
    finished = requests_finished_by_engine(server.port)
    assert set(finished) == {"0", "1"}, finished
