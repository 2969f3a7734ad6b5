"""`vllm serve` of the served tiny Llama (4 query heads, 2 KV heads) exported with tp_degree 2: two vLLM workers,
one shard each, answer concurrent greedy requests exactly as transformers does. (A --tensor-parallel-size other than
the artifact's is refused while the command line is parsed: tests/vllm/test_tensor_parallel_config.py, and a real
`vllm serve` in tests/reliability/test_startup_mismatches.py. The sharding itself, per family and against tp 1, is
tests/core/test_tensor_parallel.py.)
"""

from __future__ import annotations

import pytest
from support.client import completion_tokens, concurrently, greedy
from support.references import hf_greedy
from support.served import prompt_of
from support.server import serve

pytestmark = pytest.mark.slow  # a live `vllm serve`

TP = 2
NEW_TOKENS = 10
# Six requests for 4 slots: two wait for a slot. Lengths cross chunk boundaries (chunk 16).
PROMPT_LENGTHS = [7, 16, 33, 21, 50, 4]


@pytest.fixture(scope="module")
def server(tp2_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("tp-serve") / "server.log"
    yield from serve(tp2_dir, log, "--tensor-parallel-size", str(TP), timeout=900)


def test_concurrent_greedy_requests_equal_transformers(tiny_hf, tokenizer, server):
    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate(PROMPT_LENGTHS)]
    ask = lambda prompt: completion_tokens(server.port, greedy(server.model, prompt, NEW_TOKENS))  # noqa: E731
    answers = concurrently(ask, prompts, workers=len(prompts))
    assert answers == [hf_greedy(tiny_hf, p, NEW_TOKENS) for p in prompts]
