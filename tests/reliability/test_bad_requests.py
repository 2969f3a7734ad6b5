"""Bad requests get a clear 4xx and the server keeps serving (the real server on 127.0.0.1).

Every case checks the status, the message, then that a normal request right after it still gets
its alone greedy output. Decision (see README, Serve): prompt + max_tokens beyond the compiled
sequence length is capped, not rejected: vLLM stops the request at max_model_len with
finish_reason "length" (max_tokens alone above max_model_len is rejected with a 400).
"""

from __future__ import annotations

import pytest
from support.client import call, greedy
from support.served import SEQUENCE_LENGTH, prompt_of

pytestmark = pytest.mark.slow  # a live `vllm serve`

PROBE_TOKENS = 4


@pytest.fixture(scope="module")
def probe(server, tokenizer, alone):
    """A short normal request and its alone output: proof that the server still serves."""
    prompt = prompt_of(7, tokenizer, offset=3)
    expected = alone(prompt, PROBE_TOKENS)

    def check() -> None:
        status, body = call(server.port, "/v1/completions", greedy(server.model, prompt, PROBE_TOKENS))
        assert status == 200, body
        assert body["choices"][0]["token_ids"] == expected

    return check


def request_body(path: str, model: str, **extra) -> dict:
    if "chat" in path:
        return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
    return {"model": model, "prompt": "hi", **extra}


def rejected(status: int, body: dict, code: int, *fragments: str) -> None:
    assert status == code, body
    assert body["error"]["code"] == code
    for fragment in fragments:
        assert fragment in body["error"]["message"], body["error"]["message"]


def test_prompt_filling_the_whole_sequence_gets_the_plugins_message(server, tokenizer, probe):
    # A prompt of exactly sequence_length tokens leaves no position to generate into.
    prompt = prompt_of(SEQUENCE_LENGTH, tokenizer)
    status, body = call(server.port, "/v1/completions", greedy(server.model, prompt, 1))
    rejected(
        status,
        body,
        400,
        f"the prompt has {SEQUENCE_LENGTH} tokens but this model accepts at most {SEQUENCE_LENGTH - 1}",
        f"compiled sequence_length={SEQUENCE_LENGTH}",
        "shorten the prompt",
    )
    assert "max_tokens must be at least 1" not in body["error"]["message"]
    probe()


@pytest.mark.parametrize("extra", [1, 50])
def test_prompt_longer_than_the_sequence_length_is_rejected(server, tokenizer, probe, extra):
    length = SEQUENCE_LENGTH + extra
    status, body = call(server.port, "/v1/completions", greedy(server.model, prompt_of(length, tokenizer), 4))
    rejected(status, body, 400, f"maximum context length is {SEQUENCE_LENGTH} tokens", "reduce the length")
    probe()


def test_chat_prompt_longer_than_the_sequence_length_is_rejected(server, probe):
    messages = [{"role": "user", "content": "alpha " * (2 * SEQUENCE_LENGTH)}]
    status, body = call(server.port, "/v1/chat/completions", {"model": server.model, "messages": messages})
    rejected(status, body, 400, f"maximum context length is {SEQUENCE_LENGTH} tokens")
    probe()


def test_prompt_plus_max_tokens_beyond_the_sequence_is_capped(server, tokenizer, probe, alone):
    prompt_len, asked = 100, 50
    room = SEQUENCE_LENGTH - prompt_len
    prompt = prompt_of(prompt_len, tokenizer, offset=1)
    status, body = call(server.port, "/v1/completions", greedy(server.model, prompt, asked))
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == room
    assert body["usage"]["total_tokens"] == SEQUENCE_LENGTH
    # The capped request generates exactly what a request asking for the room would.
    assert choice["token_ids"] == alone(prompt, room)
    probe()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_max_tokens_above_max_model_len_is_rejected(server, probe, path):
    status, response = call(server.port, path, request_body(path, server.model, max_tokens=SEQUENCE_LENGTH + 1))
    rejected(status, response, 400, f"max_tokens={SEQUENCE_LENGTH + 1} cannot be greater than max_model_len")
    probe()


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/completions", {"prompt": []}, "at least one prompt"),
        ("/v1/chat/completions", {"messages": []}, "empty conversation"),
    ],
    ids=["empty-text", "empty-list", "empty-chat"],
)
def test_empty_prompt_is_rejected(server, probe, path, body, message):
    status, response = call(server.port, path, {"model": server.model, "max_tokens": 3, **body})
    rejected(status, response, 400, message)
    probe()


@pytest.mark.parametrize(
    ("params", "fragments"),
    [
        ({"top_k": 1000}, ["top_k=1000 exceeds the artifact's on-device max_topk=256", "use top_k <= 256"]),
        ({"top_p": 0.0}, ["top_p must be in (0, 1]"]),
        ({"top_p": 1.5}, ["top_p must be in (0, 1]"]),
        ({"top_p": -0.5}, ["top_p must be in (0, 1]"]),
        ({"temperature": -1.0}, ["temperature must be non-negative"]),
    ],
    ids=["top_k-above-max_topk", "top_p-0", "top_p-1.5", "top_p-negative", "temperature-negative"],
)
def test_invalid_sampling_parameters_are_rejected(server, tokenizer, probe, params, fragments):
    body = {"model": server.model, "prompt": prompt_of(5, tokenizer), "max_tokens": 3, **params}
    status, response = call(server.port, "/v1/completions", body)
    rejected(status, response, 400, *fragments)
    chat = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **params}
    status, response = call(server.port, "/v1/chat/completions", chat)
    rejected(status, response, 400, *fragments)
    probe()


def test_non_finite_temperature_is_rejected(server, probe):
    raw = b'{"model": "%s", "prompt": "hi", "max_tokens": 3, "temperature": NaN}' % server.model.encode()
    status, body = call(server.port, "/v1/completions", raw)
    rejected(status, body, 400, "temperature must be a finite number")
    probe()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unknown_model_is_404(server, probe, path):
    status, response = call(server.port, path, request_body(path, "no-such-model", max_tokens=3))
    rejected(status, response, 404, "The model `no-such-model` does not exist")
    probe()


@pytest.mark.parametrize(
    "raw", [b'{"model": "x", "prompt": ', b"not json at all", b'{"prompt": "hi",}'], ids=["truncated", "text", "comma"]
)
def test_malformed_json_is_rejected(server, probe, raw):
    status, body = call(server.port, "/v1/completions", raw)
    rejected(status, body, 400, "JSON decode error")
    probe()


def test_chat_echo_without_logprobs_is_served(server, probe):
    # vLLM turns `echo` into prompt_logprobs=top_logprobs (0 by default): a request asking for no logprobs.
    plain = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    plain.update(temperature=0.0)
    status, expected = call(server.port, "/v1/chat/completions", plain)
    assert status == 200, expected
    status, body = call(server.port, "/v1/chat/completions", {**plain, "echo": True})
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == expected["choices"][0]["message"]["content"]
    assert not body.get("prompt_logprobs")
    # Asking for prompt logprobs for real from an artifact without prompt_logits graphs: what to change.
    status, body = call(server.port, "/v1/chat/completions", {**plain, "echo": True, "prompt_logprobs": 1})
    rejected(status, body, 400, "export the model again with --prompt-logprobs")
    probe()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_prompt_logprobs_0_is_refused_like_1(server, probe, path):
    # Asked for by the client (the prompt tokens' own logprobs), not implied by chat `echo`: the same 400 as 1.
    if path == "/v1/completions":
        request = greedy(server.model, "hi", 5)
    else:
        request = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    status, body = call(server.port, path, {**request, "prompt_logprobs": 0})
    rejected(status, body, 400, "prompt_logprobs=0", "export the model again with --prompt-logprobs")
    probe()
