"""The real OpenAI-compatible server: `ONP_BACKEND=cpu vllm serve <dir> --host 127.0.0.1 --port N`, called over plain
HTTP (streamed and not), stopped by PID.

- `server`: the chunked tiny model with on-device sampling and the prompt_logits graphs, in interleaved prefill mode,
  its engine process spawned (the default start-up path); started once for the module with every option its tests
  need: completions and chat against the runtime, logprobs, prompt logprobs and prefix-cache hits; KV-cache events
  (`--kv-events-config`, `--block-size` 16); structured outputs and tool calling (see STRUCTURED below).
- `host`: the context-encoding tiny model whose token_generation returns logits (vLLM's bitmask application on the
  host), in serial prefill mode, with the same structured-output options: the structured-output tests run on both.

KV-cache events (vLLM's own, from its KV cache manager) are read the way a prefix-aware router reads them: a ZMQ
subscriber decoding vLLM's KVEventBatch. A served prompt's full blocks arrive as BlockStored with the hashes vLLM's
kv_cache_utils computes for the same tokens; a request sharing those blocks hits them
(usage.prompt_tokens_details.cached_tokens); once misses have taken every free block the blocks arrive as
BlockRemoved and the same prompt misses.

Structured outputs: both servers run with `--enable-auto-tool-choice --tool-call-parser hermes` (SmolLM2's ChatML
template) and VLLM_ENFORCE_STRICT_TOOL_CALLING=0 (see TOOLS), and `disable_any_whitespace`: a random-weight model would
otherwise fill JSON with whitespace up to max_tokens. Every form: 20 sampled requests (temperature 1, seeds 0..19)
whose outputs must conform.
"""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest
import xgrammar
from support.client import call, concurrently, greedy, stream, wait_idle
from support.kv_events import BLOCK, Subscriber, removed, stored, vllm_block_hashes
from support.references import runtime_greedy
from support.served import BATCH_SIZE, CHUNK, SEQUENCE_LENGTH, prompt_of
from support.server import Server, free_port, serve

from optimum_neuron_plugin import NeuronModelForCausalLM

pytestmark = pytest.mark.slow  # a live `vllm serve`

NEW_TOKENS = 8

STRUCTURED_TOKENS = 64
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
STRUCTURED = (
    "--structured-outputs-config",
    json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
)
STRUCTURED_ENV = {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"}  # see TOOLS


@pytest.fixture(scope="module")
def events_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(prompt_logits_dir, vllm_root, events_port):
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events_port}"}
    server = Server(
        prompt_logits_dir,
        vllm_root / "server.log",
        "--enable-prompt-tokens-details",
        "--additional-config", json.dumps({"prefill_mode": "interleaved"}),
        "--kv-events-config", json.dumps(events),
        "--block-size", str(BLOCK),
        *STRUCTURED,
        env={"ONP_STATS_FILE": str(vllm_root / "server-stats.jsonl"), **STRUCTURED_ENV},
        fork=False,  # the default start-up path: a spawned engine process
    )  # fmt: skip
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
    assert server.process.poll() is not None


@pytest.fixture(scope="module")
def host(full_host_dir, vllm_root):
    yield from serve(full_host_dir, vllm_root / "structured-host.log", *STRUCTURED, env=STRUCTURED_ENV)


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
    """Prefix caching (vLLM's) is on by default: vLLM's cached_tokens and prefix-cache counters count the hits the
    runner started from (its ONP_STATS_FILE record), no more."""
    prompt = prompt_of(3 * CHUNK + 5, tokenizer, offset=17)
    follow_up = prompt + prompt_of(6, tokenizer, offset=2)
    before = wait_idle(server.port)
    bodies = [call(server.port, "/v1/completions", completion(server, p))[1] for p in (prompt, follow_up)]
    # Another request tells the runner the previous ones finished: it writes their records.
    call(server.port, "/v1/completions", completion(server, prompt_of(2, tokenizer, offset=3), max_tokens=1))
    after = wait_idle(server.port)
    cached = [(b["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) for b in bodies]
    hit = len(prompt) // BLOCK * BLOCK
    assert cached == [0, hit]  # the full blocks of the first prompt: the follow-up leaves it mid-block
    records = [json.loads(line) for line in (vllm_root / "server-stats.jsonl").read_text().splitlines()]
    runner = [next(r["cached_tokens"] for r in records if r["req_id"].startswith(b["id"])) for b in bodies]
    assert runner == cached

    def delta(name: str) -> float:
        return sum(after.get(n, 0) - before.get(n, 0) for n in (f"vllm:{name}", f"vllm:{name}_total"))

    assert delta("prefix_cache_hits") == hit
    assert delta("prefix_cache_queries") == len(prompt) + len(follow_up) + 2


# ---- KV-cache events -----------------------------------------------------------------------------------------------


def cached_tokens(server, prompt: list[int]) -> int:
    status, body = call(server.port, "/v1/completions", greedy(server.model, prompt, 4))
    assert status == 200, body
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_events_announce_the_blocks_the_cache_holds_and_their_removal(server, events_port, tokenizer):
    subscriber = Subscriber(events_port)
    time.sleep(1)  # a SUB socket misses what is published before its subscription reaches the publisher
    prompt = prompt_of(2 * BLOCK + 8, tokenizer, offset=1)[::-1]  # reversed: no earlier prompt starts with it
    assert cached_tokens(server, prompt) == 0
    # The prompt and 3 of its 4 outputs were computed (the last one's K/V never is): vLLM's cache holds two full
    # blocks of it, and announces exactly those.
    expected = vllm_block_hashes(prompt)
    events = subscriber.until(lambda events: set(expected) <= set(stored(events)))
    assert set(stored(events)) == set(expected)
    blocks = stored(events)
    assert [blocks[h].token_ids for h in expected] == [prompt[:BLOCK], prompt[BLOCK : 2 * BLOCK]]
    assert [blocks[h].parent_block_hash for h in expected] == [None, expected[0]]
    assert {blocks[h].block_size for h in expected} == {BLOCK}
    # A router holding these events predicts two blocks for a prompt that shares them: they hit.
    sharing = prompt[: 2 * BLOCK] + prompt_of(8, tokenizer, offset=11)
    assert sharing[2 * BLOCK] != prompt[2 * BLOCK]
    assert cached_tokens(server, sharing) == 2 * BLOCK
    # Misses that allocate more blocks than the pool holds take the least recently used cached ones: the prompt's
    # blocks leave the cache, announced as removed, and the same prompt misses.
    misses = [prompt_of(5 * BLOCK + 3, tokenizer, offset=3 + i)[::-1] for i in range(4 * BATCH_SIZE)]
    for miss in misses:
        assert cached_tokens(server, miss) == 0
    events = subscriber.until(lambda events: set(expected) <= removed(events))
    # Blocks this test stored and then lost were announced stored first (earlier tests' blocks, cached before the
    # subscription, may be removed too: their stores were published before it).
    ours = {h for miss in misses for h in vllm_block_hashes(miss)} | set(expected)
    assert removed(events) & ours <= set(stored(events))
    assert cached_tokens(server, prompt) == 0


# ---- structured outputs --------------------------------------------------------------------------------------------


@pytest.fixture(params=["device", "host"])
def artifact_server(request):
    """The module's server (on-device sampling: the decode graphs mask vLLM's bitmask) or the host-sampling one."""
    return request.getfixturevalue("server" if request.param == "device" else "host")


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
    base = {"model": server.model, "max_tokens": STRUCTURED_TOKENS, "temperature": 1.0, "seed": seed}
    if endpoint == COMPLETIONS:
        base["prompt"] = f"Request {seed}:"
    else:
        base["messages"] = [{"role": "user", "content": f"Plan trip number {seed}."}]
    return {**base, **fields, **extra}


@pytest.mark.parametrize("form", list(FORMS))
def test_sampled_outputs_conform(artifact_server, form):
    endpoint, fields, check = FORMS[form]
    bodies = [request_body(artifact_server, endpoint, fields, seed) for seed in range(SAMPLES)]
    responses = concurrently(lambda body: call(artifact_server.port, endpoint, body), bodies, WORKERS)
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


def test_greedy_under_a_permissive_grammar_equals_greedy_without(artifact_server, tokenizer):
    """A regex accepting any text masks only what no text can hold (ids that leave invalid UTF-8): on prompts whose
    greedy continuation is clean text it changes nothing."""
    compared = 0
    for length in (3, 9, 17, 30):
        body = greedy(artifact_server.model, prompt_of(length, tokenizer, offset=length), 24)
        status, plain = call(artifact_server.port, COMPLETIONS, body)
        assert status == 200, plain
        if "\ufffd" in plain["choices"][0]["text"]:
            continue
        status, masked = call(artifact_server.port, COMPLETIONS, {**body, "structured_outputs": {"regex": r"[\s\S]*"}})
        assert status == 200, masked
        assert masked["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
        compared += 1
    assert compared >= 2


def test_unstructured_requests_in_a_mixed_batch_equal_their_solo_runs(artifact_server, tokenizer):
    plain = [greedy(artifact_server.model, prompt_of(n, tokenizer, offset=n), 20) for n in (4, 21, 37, 50)]
    solo = [call(artifact_server.port, COMPLETIONS, body)[1]["choices"][0]["token_ids"] for body in plain]
    structured = [
        request_body(artifact_server, endpoint, fields, seed)
        for seed, (endpoint, fields, _) in enumerate(list(FORMS.values())[:4] * 2)
    ]
    jobs = [(COMPLETIONS, body) for body in plain] + [(COMPLETIONS, body) for body in structured]
    responses = concurrently(lambda job: call(artifact_server.port, *job), jobs, len(jobs))
    assert all(status == 200 for status, _ in responses), responses
    assert [body["choices"][0]["token_ids"] for _, body in responses[: len(plain)]] == solo
    for (_, body), (_, _, check) in zip(responses[len(plain) :], list(FORMS.values())[:4] * 2, strict=True):
        check(body["choices"][0])


@pytest.mark.parametrize(
    "fields",
    [{"regex": "("}, {"json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, {"grammar": "root ::="}],
    ids=["regex", "json", "grammar"],
)
def test_a_grammar_that_cannot_compile_gets_vllms_400(server, tokenizer, fields):
    status, body = call(server.port, COMPLETIONS, request_body(server, COMPLETIONS, {"structured_outputs": fields}, 0))
    assert status == 400, body
    status, body = call(server.port, COMPLETIONS, greedy(server.model, prompt_of(5, tokenizer), 4))
    assert status == 200, body
