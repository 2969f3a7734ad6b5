"""The real OpenAI-compatible server: `ONP_BACKEND=cpu vllm serve <dir> --host 127.0.0.1 --port N`.

Started once for the module, called over plain HTTP (streamed and not), stopped by PID.
"""

from __future__ import annotations

import json

import pytest
from support.client import call, stream, wait_idle
from support.references import runtime_greedy
from support.served import CHUNK, SEQUENCE_LENGTH, prompt_of
from support.server import Server

from optimum_neuron_plugin import NeuronModelForCausalLM

pytestmark = pytest.mark.slow  # a live `vllm serve`

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def server(prompt_logits_dir, vllm_root):
    server = Server(
        prompt_logits_dir,
        vllm_root / "server.log",
        "--enable-prompt-tokens-details",
        env={"ONP_STATS_FILE": str(vllm_root / "server-stats.jsonl")},
        fork=False,  # the default start-up path: a spawned engine process
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
    assert server.process.poll() is not None


@pytest.fixture(scope="module")
def runtime(prompt_logits_dir):
    return NeuronModelForCausalLM.from_pretrained(prompt_logits_dir)


def sse_events(server, path: str, body: dict) -> list[dict]:
    """The events of a streamed request, which must be answered with a server-sent-event stream."""
    status, content_type, events = stream(server.port, path, body)
    assert status == 200 and content_type.startswith("text/event-stream"), events
    return events


def expected_text(runtime, tokenizer, prompt_ids: list[int]) -> str:
    return tokenizer.decode(runtime_greedy(runtime, prompt_ids, NEW_TOKENS), skip_special_tokens=True)


def completion(server, prompt, **kwargs) -> dict:
    body = {"model": server.model, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    return {**body, **kwargs}


def chat(server, content: str, **kwargs) -> dict:
    messages = [{"role": "user", "content": content}]
    body = {"model": server.model, "messages": messages, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    return {**body, **kwargs}


def test_completions_match_the_runtime(server, runtime, tokenizer):
    for length in (5, 40):
        prompt = prompt_of(length, tokenizer)
        status, body = call(server.port, "/v1/completions", completion(server, prompt))
        assert status == 200, body
        choice = body["choices"][0]
        assert choice["text"] == expected_text(runtime, tokenizer, prompt)
        assert choice["finish_reason"] == "length"
        assert body["usage"] == {**body["usage"], "prompt_tokens": length, "completion_tokens": NEW_TOKENS}
        streamed = "".join(
            c["choices"][0]["text"] for c in sse_events(server, "/v1/completions", completion(server, prompt))
        )
        assert streamed == choice["text"]


def test_chat_completions_match_the_runtime(server, runtime, tokenizer):
    content = "What is the capital of France?"
    prompt_ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    status, body = call(server.port, "/v1/chat/completions", chat(server, content))
    assert status == 200, body
    text = body["choices"][0]["message"]["content"]
    assert text == expected_text(runtime, tokenizer, list(prompt_ids))
    chunks = list(sse_events(server, "/v1/chat/completions", chat(server, content)))
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == text


def test_seeded_sampling_is_reproducible(server, tokenizer):
    prompt = prompt_of(12, tokenizer)
    sampled = completion(server, prompt, temperature=1.0, top_p=0.95, seed=99)
    texts = [call(server.port, "/v1/completions", sampled)[1]["choices"][0]["text"] for _ in range(2)]
    assert texts[0] == texts[1]
    streamed = "".join(c["choices"][0]["text"] for c in sse_events(server, "/v1/completions", sampled))
    assert streamed == texts[0]


@pytest.mark.parametrize("length", [SEQUENCE_LENGTH, SEQUENCE_LENGTH + 50])
def test_too_long_prompt_gets_400_and_the_server_keeps_serving(server, tokenizer, length):
    status, body = call(server.port, "/v1/completions", completion(server, prompt_of(length, tokenizer)))
    # vLLM's own front end answers first here (context length / max_tokens); the platform's
    # validate_request is the backstop for what reaches the engine.
    assert status == 400, body
    assert body["error"]["code"] == 400 and body["error"]["message"]
    status, body = call(server.port, "/v1/completions", completion(server, prompt_of(5, tokenizer)))
    assert status == 200 and body["usage"]["completion_tokens"] == NEW_TOKENS


def test_logprobs_are_served_within_the_compiled_limit(server, tokenizer):
    """The on-device artifact returns logprobs for every token (the first from host logits, the rest from the decode
    graphs); beyond its max_logprobs (20) the answer is a 400 saying what to change."""
    prompt = prompt_of(5, tokenizer)
    status, body = call(server.port, "/v1/completions", completion(server, prompt, logprobs=2))
    assert status == 200, body
    logprobs = body["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["top_logprobs"]) == NEW_TOKENS
    assert all(2 <= len(top) <= 3 and max(top.values()) <= 0 for top in logprobs["top_logprobs"])
    assert all(
        lp == max(top.values()) for lp, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True)
    )  # greedy
    status, body = call(server.port, "/v1/chat/completions", chat(server, "hi", logprobs=True, top_logprobs=3))
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == NEW_TOKENS and all(len(token["top_logprobs"]) == 3 for token in content)
    for request, path, message in (
        (completion(server, prompt, logprobs=21), "/v1/completions", "greater than max allowed: 20"),
    ):
        status, body = call(server.port, path, request)
        assert status == 400 and message in body["error"]["message"], body


def test_echo_with_logprobs_serves_prompt_logprobs(server, runtime, tokenizer):
    """Completions `echo` + `logprobs` answer with the prompt's tokens and their logprobs (from the prompt_logits
    graphs, over several chunks) before the generated ones; chat `echo` + `logprobs` with `prompt_logprobs`."""
    import torch

    prompt = prompt_of(2 * CHUNK + 3, tokenizer)
    status, body = call(server.port, "/v1/completions", completion(server, prompt, logprobs=2, echo=True))
    assert status == 200, body
    logprobs = body["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(prompt) + NEW_TOKENS
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = torch.log_softmax(runtime.prefill_positions(0, prompt), dim=-1)
    served = logprobs["token_logprobs"][1 : len(prompt)]
    assert served == pytest.approx([float(expected[i, t]) for i, t in enumerate(prompt[1:])], abs=1e-4)
    assert all(2 <= len(top) <= 3 for top in logprobs["top_logprobs"][1:])
    status, body = call(server.port, "/v1/chat/completions", chat(server, "hi", logprobs=True, echo=True))
    assert status == 200, body
    entries = body["prompt_logprobs"]
    assert entries[0] is None and len(entries) > 1 and all(len(entry) == 1 for entry in entries[1:])


def test_cached_tokens_and_metrics_report_the_runners_hits(server, tokenizer, vllm_root):
    """Prefix caching is on by default: vLLM's cached_tokens and prefix-cache counters count the hits the runner
    started from (its ONP_STATS_FILE record), no more."""
    prompt = prompt_of(3 * CHUNK + 5, tokenizer, offset=17)
    follow_up = prompt + prompt_of(6, tokenizer, offset=2)
    before = wait_idle(server.port)
    bodies = [call(server.port, "/v1/completions", completion(server, p))[1] for p in (prompt, follow_up)]
    # Another request tells the runner the previous ones finished: it writes their records.
    call(server.port, "/v1/completions", completion(server, prompt_of(2, tokenizer, offset=3), max_tokens=1))
    after = wait_idle(server.port)
    cached = [(b["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) for b in bodies]
    assert cached == [0, len(prompt)]  # the hit ends mid-chunk, where the follow-up leaves the first prompt
    records = [json.loads(line) for line in (vllm_root / "server-stats.jsonl").read_text().splitlines()]
    runner = [next(r["cached_tokens"] for r in records if r["req_id"].startswith(b["id"])) for b in bodies]
    assert runner == cached

    def delta(name: str) -> float:
        return sum(after.get(n, 0) - before.get(n, 0) for n in (f"vllm:{name}", f"vllm:{name}_total"))

    assert delta("prefix_cache_hits") == len(prompt)
    assert delta("prefix_cache_queries") == len(prompt) + len(follow_up) + 2
