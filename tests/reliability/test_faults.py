"""Faults: corrupt artifacts stop `vllm serve` at startup naming the file; a graph that raises while
serving fails only its requests (500) and the server keeps serving.

Startup: a missing graph, truncated weights, a neuron_config.json from a newer format or missing a
field, and a graph file from another export (it loads, then fails its first call in the warm-up). One `vllm serve`
run per startup step that fails; a variant that fails in the same step is checked on the function of that step.
Serving: the interleaved server's model has a 1000-row embedding table behind a 49152-id tokenizer;
a prompt holding id >= 1000 passes vLLM's checks and makes the prefill graph raise (IndexError),
a real run-time graph failure with no mock. Decision (README, Serve): the requests of the failing
graph call finish with an error (HTTP 500, "Internal server error"; the server log names the graph
file and the error), their KV blocks and batch rows are freed, and every other request is served.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.client import call, completion_tokens, concurrently, greedy, health, stream_tokens, wait_idle
from support.served import BATCH_SIZE

from optimum_neuron_plugin import NeuronModelForCausalLM
from optimum_neuron_plugin.artifact import ArtifactError, load_neuron_config
from optimum_neuron_plugin.config import FORMAT_VERSION

from .conftest import SMALL_VOCAB, SMALL_VOCAB_PREFILL_BUCKETS, STARTUP_RUNS

pytestmark = pytest.mark.slow  # a live `vllm serve`

CORRUPT = {
    "missing-graph": ("graphs/token_generation_128.pt2", "missing compiled graph; export the model again"),
    "truncated-weights": ("model.safetensors", "unreadable or truncated"),
    "newer-format": (
        "neuron_config.json",
        f"format_version {FORMAT_VERSION + 1} is not supported by this optimum-neuron-plugin",
    ),
    "missing-field": ("neuron_config.json", "missing field(s) sequence_length; export the model again"),
    "foreign-graph": ("graphs/token_generation_128.pt2", "the compiled graph token_generation fails on its first call"),
}
NEW_TOKENS = 12


def assert_names_the_file(output: str, directory: Path, name: str) -> None:
    file, message = CORRUPT[name]
    assert f"{directory / file}: " in output, output[-3000:]
    assert message in output
    assert "export the model again" in output or "upgrade the plugin" in output


@pytest.mark.parametrize("name", STARTUP_RUNS)
def test_corrupt_artifact_stops_the_server_at_startup(refusals, rel_root, name):
    result = refusals.result(name)
    assert not result.timed_out, f"vllm serve still running after {result.seconds:.0f} s:\n{result.output[-3000:]}"
    assert result.returncode != 0, result.output[-3000:]
    assert_names_the_file(result.output, rel_root / "corrupt" / name, name)
    assert "Starting vLLM server" not in result.output


# The variant, and the startup step that reads it (conftest STARTUP_RUNS: a `vllm serve` run of the same step).
SAME_STEP = {
    "newer-format": load_neuron_config,  # the API server's configuration check, as missing-field
    "truncated-weights": NeuronModelForCausalLM.from_pretrained,  # the engine process's load, as missing-graph
}


@pytest.mark.parametrize("name", SAME_STEP)
def test_corrupt_artifact_fails_the_startup_step_that_reads_it(corrupt, monkeypatch, name):
    monkeypatch.setenv("ONP_BACKEND", "cpu")
    with pytest.raises(ArtifactError) as error:
        SAME_STEP[name](corrupt[name])
    assert_names_the_file(str(error.value), corrupt[name], name)


def good_prompts() -> list[list[int]]:
    return [[100 + 3 * i + j for j in range(5 + 11 * i)] for i in range(BATCH_SIZE)]


def bad_prompt(n: int) -> list[int]:
    return [5, 6, 7 + n, SMALL_VOCAB + 4000 + n, 8]  # one id beyond the embedding table


def test_a_graph_failure_fails_its_request_and_the_server_keeps_serving(interleaved_server, alone_interleaved):
    server = interleaved_server
    good = good_prompts()
    expected = [alone_interleaved(p, NEW_TOKENS) for p in good]

    def run(job):
        kind, prompt = job
        body = greedy(server.model, prompt, NEW_TOKENS)
        if kind == "stream":
            return stream_tokens(server.port, body)
        return call(server.port, "/v1/completions", body)

    # Good requests running while two bad ones (one streamed) fail next to them.
    jobs = [("plain", p) for p in good[:-1]] + [("plain", bad_prompt(0)), ("stream", bad_prompt(1))]
    results = concurrently(run, jobs, len(jobs))
    for (status, body), want in zip(results[: len(good) - 1], expected, strict=False):
        assert status == 200, body
        assert body["choices"][0]["token_ids"] == want
    status, body = results[-2]
    assert status == 500, body
    assert body["error"]["code"] == 500 and body["error"]["message"] == "Internal server error"
    status, tokens, errors = results[-1]
    assert status == 200 and tokens == []  # the stream had started: the error is its last event
    assert errors and errors[0]["error"]["code"] == 500, errors

    log = server.log.read_text()
    buckets = SMALL_VOCAB_PREFILL_BUCKETS
    graph_files = ", ".join(f"{server.model}/graphs/chunked_prefill_{bucket}.pt2" for bucket in buckets)
    assert f"graph chunked_prefill ({graph_files}) raised IndexError" in log
    assert "the server keeps serving" in log
    assert server.process.poll() is None and health(server.port) == 200


def test_repeated_graph_failures_leak_no_slot(interleaved_server, alone_interleaved):
    server = interleaved_server
    statuses = concurrently(
        lambda n: call(server.port, "/v1/completions", greedy(server.model, bad_prompt(n), 4))[0],
        range(3 * BATCH_SIZE),
        2 * BATCH_SIZE,
    )
    assert statuses == [500] * (3 * BATCH_SIZE)
    wait_idle(server.port)
    # batch_size requests together need every slot back.
    good = good_prompts()
    outputs = concurrently(
        lambda p: completion_tokens(server.port, greedy(server.model, p, NEW_TOKENS)), good, len(good)
    )
    assert outputs == [alone_interleaved(p, NEW_TOKENS) for p in good]
    assert server.process.poll() is None and health(server.port) == 200
