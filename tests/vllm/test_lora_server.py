"""`vllm serve --enable-lora` on an export with 2 LoRA slots: adapters named by --lora-modules and loaded or dropped
while serving (VLLM_ALLOW_RUNTIME_LORA_UPDATING) answer each request with the Python API's tokens for the same
adapter; a load the export cannot hold is answered 400 with what to change, and the server keeps serving."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.client import call, concurrently, greedy, stream_tokens, text_call
from support.lora import make_adapter
from support.served import CHUNK, LORA_RANK, prompt_of
from support.server import serve
from transformers import LlamaConfig, LlamaForCausalLM

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


def runtime_tokens(
    model, lora_adapters, prompt: list[int], name: str | None, new_tokens: int = NEW_TOKENS
) -> list[int]:
    if name is not None and name not in model.adapters:
        model.unload_adapter(next(iter(model.adapters)))
        model.load_adapter(name, lora_adapters[name][0])
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, eos_token_id=[], adapters=[name])
    return out[0, len(prompt) :].tolist()


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


def test_runtime_load_and_unload(server, runtime, lora_adapters, tokenizer, vllm_root):
    prompt = prompt_of(11, tokenizer, offset=5)
    third = {"lora_name": "third", "lora_path": str(lora_adapters["third"][0])}
    assert text_call(server.port, "/v1/load_lora_adapter", third)[0] == 200
    status, body = completion(server.port, "third", prompt)  # no free slot: the least recently used one is given up
    assert status == 200 and body["choices"][0]["token_ids"] == runtime_tokens(runtime, lora_adapters, prompt, "third")
    status, body = text_call(server.port, "/v1/load_lora_adapter", third)
    assert status == 400 and "has already been loaded" in body  # vLLM's own check
    assert text_call(server.port, "/v1/unload_lora_adapter", {"lora_name": "third"})[0] == 200
    assert completion(server.port, "third", prompt)[0] == 404


def bad_adapters(root: Path, tiny_hf, lora_adapters) -> dict[str, tuple[Path, str]]:
    """Adapters the export cannot hold: name -> (directory, what the refusal says)."""
    made = root / "adapters" / "bad"
    make_adapter(tiny_hf, made / "wide", 9, 2 * LORA_RANK, ["q_proj"])
    make_adapter(tiny_hf, made / "head", 10, 4, ["lm_head"])
    other = LlamaForCausalLM(LlamaConfig(**{**tiny_hf.config.to_dict(), "hidden_size": 2 * tiny_hf.config.hidden_size}))
    make_adapter(other, made / "other-base", 11, 4, ["q_proj"])
    quantized = made / "int8"  # the first adapter's config, its weights stored as integers
    quantized.mkdir(parents=True, exist_ok=True)
    shutil.copy(lora_adapters["first"][0] / "adapter_config.json", quantized)
    tensors = load_file(lora_adapters["first"][0] / "adapter_model.safetensors")
    save_file({k: v.to(torch.int8) for k, v in tensors.items()}, quantized / "adapter_model.safetensors")
    return {
        "wide": (made / "wide", f"rank {2 * LORA_RANK} exceeds this export's max_lora_rank {LORA_RANK}: export "
                 f"again with --max-lora-rank {2 * LORA_RANK} or more"),
        "head": (made / "head", "LoRA slots hold the decoder layers' attention and MLP projections: train the "
                 "adapter on those only"),
        "other-base": (made / "other-base", "the adapter was trained for another base model"),
        "int8": (quantized, "is I8; LoRA weights are floating point"),
        "missing": (root / "nowhere", "no such directory on this host; give the path of a PEFT LoRA adapter"),
    }  # fmt: skip


def test_bad_loads_are_400_with_what_to_change(server, runtime, lora_adapters, tokenizer, vllm_root, tiny_hf):
    """Each adapter the export cannot hold: 400 naming what to change, on vLLM's route and on SageMaker's /adapters
    (which vLLM maps onto the same load); the server and the loaded adapters serve on."""
    routes = {"/v1/load_lora_adapter": ("lora_name", "lora_path"), "/adapters": ("name", "src")}
    for name, (path, refusal) in bad_adapters(vllm_root, tiny_hf, lora_adapters).items():
        for route, (name_field, path_field) in routes.items():
            status, body = text_call(server.port, route, {name_field: name, path_field: str(path)})
            assert status == 400, (route, name, body)
            error = json.loads(body)["error"]
            assert refusal in error["message"] and error["param"] == path_field, (route, name, error)
    status, models = call(server.port, "/v1/models", b"", method="GET")
    assert status == 200 and {"first", "second"} <= {card["id"] for card in models["data"]}
    assert not {"wide", "head", "other-base", "int8", "missing"} & {card["id"] for card in models["data"]}
    prompt = prompt_of(9, tokenizer, offset=3)
    for name in ("first", "second", server.model):
        status, body = completion(server.port, name, prompt)
        adapter = None if name == server.model else name
        assert status == 200, body
        assert body["choices"][0]["token_ids"] == runtime_tokens(runtime, lora_adapters, prompt, adapter), name


def test_unloading_an_adapter_in_use(server, runtime, lora_adapters, tokenizer):
    """vLLM's unload drops the name only: a request already running on the adapter finishes on it, with its
    tokens; a new request for the name gets 404 until it is loaded again."""
    prompt, tokens = prompt_of(6, tokenizer, offset=8), 64
    after_unload: list[dict] = []
    unloaded: list[tuple[int, str]] = []

    def on_event(event: dict) -> None:
        if not unloaded:
            unloaded.append(text_call(server.port, "/v1/unload_lora_adapter", {"lora_name": "second"}))
        else:
            after_unload.append(event)

    status, streamed, errors = stream_tokens(server.port, greedy("second", prompt, tokens), on_event)
    assert unloaded[0][0] == 200 and after_unload, unloaded  # answered while the stream ran
    assert status == 200 and not errors
    assert streamed == runtime_tokens(runtime, lora_adapters, prompt, "second", tokens)
    status, body = completion(server.port, "second", prompt)
    assert status == 404 and "does not exist" in json.dumps(body)
    second = {"lora_name": "second", "lora_path": str(lora_adapters["second"][0])}
    assert text_call(server.port, "/v1/load_lora_adapter", second)[0] == 200
    status, body = completion(server.port, "second", prompt)
    assert status == 200 and body["choices"][0]["token_ids"] == runtime_tokens(runtime, lora_adapters, prompt, "second")
