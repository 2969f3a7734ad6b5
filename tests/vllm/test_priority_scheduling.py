"""--scheduling-policy priority on the real engine, in both prefill modes: concurrent requests of mixed priority and
length are all answered (the transformers greedy tokens), and a request gets its first token no later than any
request of a lower priority (a higher value)."""

from __future__ import annotations

import pytest
from support.engine import close_llm, make_llm
from support.references import hf_greedy
from support.served import CHUNK, prompt_of

pytestmark = pytest.mark.slow  # an in-process vLLM engine

NEW_TOKENS = 4
MAX_STEPS = 200  # far more than 8 requests need: a livelocked scheduler schedules nothing, step after step
# (request, priority, prompt tokens): the most urgent prompts are the longest, so shortest-first would pick others.
REQUESTS = [
    ("p2-short", 2, 3),
    ("p1-mid", 1, 2 * CHUNK + 1),
    ("p0-long", 0, 6 * CHUNK + 5),
    ("p2-mid", 2, CHUNK),
    ("p0-mid", 0, 4 * CHUNK),
    ("p1-short", 1, 7),
    ("p2-long", 2, 5 * CHUNK),
    ("p1-tiny", 1, 1),
]


@pytest.fixture(scope="module", params=["interleaved", "serial"])
def llm(request, chunked_dir):
    # The interleaved engine keeps the default latency target: before the runner's first output it plans one call.
    engine = make_llm(chunked_dir, scheduling_policy="priority", additional_config={"prefill_mode": request.param})
    yield engine
    close_llm(engine)


def test_concurrent_requests_are_served_in_priority_order(llm, tokenizer, tiny_hf):
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    prompts = {req_id: prompt_of(n, tokenizer, offset=i) for i, (req_id, _, n) in enumerate(REQUESTS)}
    for req_id, priority, _ in REQUESTS:
        engine.add_request(req_id, {"prompt_token_ids": prompts[req_id]}, params, priority=priority)
    outputs: dict[str, list[int]] = {}
    first_token_step: dict[str, int] = {}
    for steps in range(MAX_STEPS):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            outputs[out.request_id] = list(out.outputs[0].token_ids)
            if out.outputs[0].token_ids:
                first_token_step.setdefault(out.request_id, steps)
    assert not engine.has_unfinished_requests(), f"unfinished after {MAX_STEPS} steps: {sorted(outputs)}"
    for req_id, prompt in prompts.items():
        assert outputs[req_id] == hf_greedy(tiny_hf, prompt, NEW_TOKENS), req_id
    priority = {req_id: p for req_id, p, _ in REQUESTS}
    for a in prompts:
        for b in prompts:
            if priority[a] < priority[b]:
                assert first_token_step[a] <= first_token_step[b], (a, b, first_token_step)
