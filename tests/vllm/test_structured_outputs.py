"""Structured outputs and tool calling through a live `vllm serve`, on both artifact kinds.

- `device`: the chunked tiny model with on-device sampling (the decode graphs mask vLLM's bitmask), interleaved
  prefill mode;
- `host`: the context-encoding tiny model whose token_generation returns logits (vLLM's bitmask application on the
  host), serial prefill mode;
both with `--enable-auto-tool-choice --tool-call-parser hermes` (SmolLM2's ChatML template) and
VLLM_ENFORCE_STRICT_TOOL_CALLING=0 (see TOOLS).
Both with `disable_any_whitespace`: a random-weight model would otherwise fill JSON with whitespace up to max_tokens.
Every form: 20 sampled requests (temperature 1, seeds 0..19) whose outputs must conform.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import xgrammar
from support.client import call, concurrently, greedy
from support.served import SEQUENCE_LENGTH, prompt_of
from support.server import serve

NEW_TOKENS = 64
SAMPLES = 20
# tool_choice "required" decodes a JSON array of calls of any length, and a random-weight model spells the fixed
# strings of the schema with short tokens: some outputs reach the end of the sequence (128 positions) unfinished.
# Those are cut, not wrong (vLLM would have ended a request whose token broke the grammar); the rest must conform.
MAY_BE_CUT = {"tool_choice.required"}
WORKERS = 8
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Lima", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "metric": {"type": "boolean"},
    },
    "required": ["city", "days", "metric"],
    "additionalProperties": False,
}
ZONE = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
# Both servers decode required / named tool calls under vLLM's JSON schema of the tools (the device server turns off
# vLLM's strict tool calling, whose hermes structural tag allows free whitespace in the arguments: a random-weight
# model fills them with it up to max_tokens).
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA, "strict": True}},
    {"type": "function", "function": {"name": "get_time", "parameters": ZONE, "strict": True}},
]
REGEX = r"[a-c]{2,4}-[0-9]{1,3}"
CHOICES = ["red", "green", "blue"]
GRAMMAR = 'root ::= greeting " " name\ngreeting ::= "hi" | "hello"\nname ::= [a-z] | [a-z] [a-z] | [a-z] [a-z] [a-z]'
GRAMMAR_LANGUAGE = r"(hi|hello) [a-z]{1,3}"
SERVE_ARGS = (
    "--structured-outputs-config",
    json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
)
SERVE_ENV = {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"}  # see TOOLS


@pytest.fixture(scope="module")
def device(chunked_dir, vllm_root):
    interleaved = ("--additional-config", json.dumps({"prefill_mode": "interleaved"}))
    yield from serve(chunked_dir, vllm_root / "structured-device.log", *SERVE_ARGS, *interleaved, env=SERVE_ENV)


@pytest.fixture(scope="module")
def host(full_host_dir, vllm_root):
    yield from serve(full_host_dir, vllm_root / "structured-host.log", *SERVE_ARGS, env=SERVE_ENV)


@pytest.fixture(params=["device", "host"])
def server(request):
    return request.getfixturevalue(request.param)


# ---- the forms: (endpoint, request fields, check of the response's choice) -----------------------------------------


def text_of(choice: dict) -> str:
    return choice["text"] if "text" in choice else choice["message"]["content"]


def conforms_to_schema(choice: dict) -> None:
    jsonschema.validate(json.loads(text_of(choice)), SCHEMA)


def is_json_object(choice: dict) -> None:
    """A whole JSON object, or, cut by max_tokens (a random model rarely closes a free string), a prefix of one
    (checked by xgrammar's own matcher, without vLLM)."""
    text = text_of(choice)
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict), text
        return
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo(["a"]))
    matcher = xgrammar.GrammarMatcher(compiler.compile_json_schema(json.dumps({"type": "object"})))
    assert choice["finish_reason"] == "length" and matcher.accept_string(text), text


def matches(pattern: str):
    def check(choice: dict) -> None:
        assert re.fullmatch(pattern, text_of(choice)), text_of(choice)

    return check


def is_a_choice(choice: dict) -> None:
    assert text_of(choice) in CHOICES


def calls_tools(names: set[str]):
    def check(choice: dict) -> None:
        calls = choice["message"]["tool_calls"]
        assert calls and {c["function"]["name"] for c in calls} <= names
        for c in calls:
            schema = SCHEMA if c["function"]["name"] == "get_weather" else ZONE
            jsonschema.validate(json.loads(c["function"]["arguments"]), schema)

    return check


COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
FORMS = {
    "structured_outputs.json": (COMPLETIONS, {"structured_outputs": {"json": SCHEMA}}, conforms_to_schema),
    "structured_outputs.regex": (COMPLETIONS, {"structured_outputs": {"regex": REGEX}}, matches(REGEX)),
    "structured_outputs.choice": (COMPLETIONS, {"structured_outputs": {"choice": CHOICES}}, is_a_choice),
    "structured_outputs.grammar": (
        COMPLETIONS,
        {"structured_outputs": {"grammar": GRAMMAR}},
        matches(GRAMMAR_LANGUAGE),
    ),
    "response_format.json_schema": (
        CHAT,
        {"response_format": {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}},
        conforms_to_schema,
    ),
    "response_format.json_object": (CHAT, {"response_format": {"type": "json_object"}}, is_json_object),
    "tool_choice.required": (
        CHAT,
        {"tools": TOOLS, "tool_choice": "required", "max_tokens": SEQUENCE_LENGTH},
        calls_tools({"get_weather", "get_time"}),
    ),
    "tool_choice.named": (
        CHAT,
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        calls_tools({"get_time"}),
    ),
}


def request_body(server, endpoint: str, fields: dict, seed: int, **extra) -> dict:
    base = {"model": server.model, "max_tokens": NEW_TOKENS, "temperature": 1.0, "seed": seed}
    if endpoint == COMPLETIONS:
        base["prompt"] = f"Request {seed}:"
    else:
        base["messages"] = [{"role": "user", "content": f"Plan trip number {seed}."}]
    return {**base, **fields, **extra}


@pytest.mark.slow
@pytest.mark.parametrize("form", list(FORMS))
def test_sampled_outputs_conform(server, form):
    endpoint, fields, check = FORMS[form]
    bodies = [request_body(server, endpoint, fields, seed) for seed in range(SAMPLES)]
    responses = concurrently(lambda body: call(server.port, endpoint, body), bodies, WORKERS)
    outputs, cut = set(), 0
    for status, body in responses:
        assert status == 200, body
        choice = body["choices"][0]
        if form in MAY_BE_CUT and choice["finish_reason"] == "length":
            cut += 1
            continue
        check(choice)
        outputs.add(json.dumps(choice.get("message", {}).get("tool_calls")) + str(text_of(choice)))
    assert cut <= SAMPLES // 2, f"{cut} of {SAMPLES} outputs cut by the sequence length"
    assert len(outputs) > 1  # sampled, not one forced output


@pytest.mark.slow
def test_greedy_under_a_permissive_grammar_equals_greedy_without(server, tokenizer):
    """A regex accepting any text masks only what no text can hold (ids that leave invalid UTF-8): on prompts whose
    greedy continuation is clean text it changes nothing."""
    compared = 0
    for length in (3, 9, 17, 30):
        body = greedy(server.model, prompt_of(length, tokenizer, offset=length), 24)
        status, plain = call(server.port, COMPLETIONS, body)
        assert status == 200, plain
        if "\ufffd" in plain["choices"][0]["text"]:
            continue
        status, masked = call(server.port, COMPLETIONS, {**body, "structured_outputs": {"regex": r"[\s\S]*"}})
        assert status == 200, masked
        assert masked["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
        compared += 1
    assert compared >= 2


@pytest.mark.slow
def test_unstructured_requests_in_a_mixed_batch_equal_their_solo_runs(server, tokenizer):
    plain = [greedy(server.model, prompt_of(n, tokenizer, offset=n), 20) for n in (4, 21, 37, 50)]
    solo = [call(server.port, COMPLETIONS, body)[1]["choices"][0]["token_ids"] for body in plain]
    structured = [
        request_body(server, endpoint, fields, seed)
        for seed, (endpoint, fields, _) in enumerate(list(FORMS.values())[:4] * 2)
    ]
    jobs = [(COMPLETIONS, body) for body in plain] + [(COMPLETIONS, body) for body in structured]
    responses = concurrently(lambda job: call(server.port, *job), jobs, len(jobs))
    assert all(status == 200 for status, _ in responses), responses
    assert [body["choices"][0]["token_ids"] for _, body in responses[: len(plain)]] == solo
    for (_, body), (_, _, check) in zip(responses[len(plain) :], list(FORMS.values())[:4] * 2, strict=True):
        check(body["choices"][0])


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields",
    [{"regex": "("}, {"json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, {"grammar": "root ::="}],
    ids=["regex", "json", "grammar"],
)
def test_a_grammar_that_cannot_compile_gets_vllms_400(device, tokenizer, fields):
    status, body = call(device.port, COMPLETIONS, request_body(device, COMPLETIONS, {"structured_outputs": fields}, 0))
    assert status == 400, body
    status, body = call(device.port, COMPLETIONS, greedy(device.model, prompt_of(5, tokenizer), 4))
    assert status == 200, body


@pytest.mark.parametrize("on_device_sampling", [True, False])
def test_an_on_device_artifact_without_the_bitmask_refuses_structured_outputs(on_device_sampling):
    """An on-device artifact exported with token_bitmask false has no bitmask input: its structured requests get a
    400 saying to export again; a host-sampling one masks host logits either way."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams

    from optimum_neuron_plugin.vllm.limits import ServingLimits
    from optimum_neuron_plugin.vllm.options import PrefillMode
    from optimum_neuron_plugin.vllm.request_checks import check_sampling

    limits = ServingLimits(
        128, 128, 4, on_device_sampling, 256, PrefillMode.SERIAL, structured_outputs=not on_device_sampling
    )
    params = SamplingParams(structured_outputs=StructuredOutputsParams(choice=CHOICES))
    if on_device_sampling:
        with pytest.raises(VLLMValidationError, match="export the model again"):
            check_sampling(limits, params)
    else:
        check_sampling(limits, params)
    check_sampling(limits, SamplingParams())
