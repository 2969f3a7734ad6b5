"""`vllm serve --enable-lora` on an export with 2 LoRA slots: adapters named by --lora-modules and loaded or dropped
while serving (VLLM_ALLOW_RUNTIME_LORA_UPDATING) answer each request with the Python API's tokens for the same
adapter; bad loads are refused and the server keeps serving."""

from __future__ import annotations

import http.client
import json

import pytest
import torch
from support.client import HOST, call, concurrently, greedy
from support.lora import make_adapter
from support.served import CHUNK, LORA_RANK, prompt_of
from support.server import serve

from optimum_neuron_plugin import NeuronModelForCausalLM

pytestmark = pytest.mark.slow  # a live `vllm serve`
pytest.importorskip("peft")

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def server(lora_dir, lora_adapters, tmp_path_factory):
    modules = [f"{name}={lora_adapters[name][0]}" for name in ("first", "second")]
    log = tmp_path_factory.mktemp("lora-server") / "serve.log"
    yield from serve(
        lora_dir, log, "--enable-lora", "--max-loras", "2", "--max-lora-rank", str(LORA_RANK), "--max-cpu-loras", "3",
        "--lora-modules", *modules, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def runtime(lora_dir, lora_adapters):
    """The Python API on the same export with the same adapters (two slots: "third" replaces "second" when needed)."""
    model = NeuronModelForCausalLM.from_pretrained(lora_dir)
    for name in ("first", "second"):
        model.load_adapter(name, lora_adapters[name][0])
    return model


def runtime_tokens(model, lora_adapters, prompt: list[int], name: str | None) -> list[int]:
    if name is not None and name not in model.adapters:
        model.unload_adapter(next(iter(model.adapters)))
        model.load_adapter(name, lora_adapters[name][0])
    out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, eos_token_id=[], adapters=[name])
    return out[0, len(prompt) :].tolist()


def adapter_call(port: int, path: str, body: dict) -> tuple[int, str]:
    """/v1/load_lora_adapter or /v1/unload_lora_adapter: (status, the body as text: plain text on success)."""
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        connection.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def completion(port: int, model: str, prompt: list[int]) -> tuple[int, dict]:
    return call(port, "/v1/completions", greedy(model, prompt, NEW_TOKENS))


def test_models_lists_the_adapters(server):
    status, body = call(server.port, "/v1/models", b"", method="GET")
    assert status == 200
    assert {"first", "second"} <= {card["id"] for card in body["data"]}


def test_mixed_requests_equal_the_python_api(server, runtime, lora_adapters, tokenizer):
    """Base model and both adapters at once, concurrently (one batch): each answer is the Python API's."""
    names = [server.model, "first", "second", "first"]
    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate((10, 2 * CHUNK + 5, 7, 12))]
    results = concurrently(lambda pair: completion(server.port, *pair), list(zip(names, prompts, strict=True)), 4)
    for name, prompt, (status, body) in zip(names, prompts, results, strict=True):
        assert status == 200, body
        adapter = None if name == server.model else name
        assert body["choices"][0]["token_ids"] == runtime_tokens(runtime, lora_adapters, prompt, adapter), name


def test_runtime_load_and_unload(server, runtime, lora_adapters, tokenizer, vllm_root, tiny_hf):
    prompt = prompt_of(11, tokenizer, offset=5)
    third = {"lora_name": "third", "lora_path": str(lora_adapters["third"][0])}
    assert adapter_call(server.port, "/v1/load_lora_adapter", third)[0] == 200
    status, body = completion(server.port, "third", prompt)  # no free slot: the least recently used one is given up
    assert status == 200 and body["choices"][0]["token_ids"] == runtime_tokens(runtime, lora_adapters, prompt, "third")
    # Bad loads: a name already loaded, a missing path, a rank beyond the export's; the server keeps serving.
    status, body = adapter_call(server.port, "/v1/load_lora_adapter", third)
    assert status == 400 and "has already been loaded" in body
    missing = {"lora_name": "missing", "lora_path": str(vllm_root / "nowhere")}
    status, body = adapter_call(server.port, "/v1/load_lora_adapter", missing)
    assert status == 404 and "No adapter found for" in body
    make_adapter(tiny_hf, vllm_root / "adapters" / "wide-server", 9, 2 * LORA_RANK, ["q_proj"])
    wide = {"lora_name": "wide", "lora_path": str(vllm_root / "adapters" / "wide-server")}
    status, body = adapter_call(server.port, "/v1/load_lora_adapter", wide)
    # vLLM answers an adapter its engine refuses with 500, whatever the reason (entrypoints/openai/models/serving.py)
    assert status == 500 and f"exceeds this export's max_lora_rank {LORA_RANK}" in body
    assert adapter_call(server.port, "/v1/unload_lora_adapter", {"lora_name": "third"})[0] == 200
    assert completion(server.port, "third", prompt)[0] == 404
    status, body = completion(server.port, "first", prompt)
    assert status == 200 and body["choices"][0]["token_ids"] == runtime_tokens(runtime, lora_adapters, prompt, "first")
