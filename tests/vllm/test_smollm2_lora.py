"""`vllm serve` of a SmolLM2 export with 4 LoRA slots of rank 16: the base model and three random PEFT adapters in
one batch, then a fourth and a fifth adapter loaded while requests run, all five swapping through the 4 slots under
load. Every answer is greedy-equal to transformers + peft on the same SmolLM2 weights, and no request fails."""

from __future__ import annotations

import threading

import pytest
from support.cli import run_export
from support.client import call, concurrently, greedy, text_call
from support.engine import hf_greedy_cached
from support.lora import ALL_TARGETS, AdapterSpec, make_adapters
from support.server import serve
from support.smollm2 import smollm2_gguf, smollm2_tokenizer

from optimum_neuron_plugin.sources import gguf_read_once

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # a SmolLM2 export and a live server
pytest.importorskip("peft")

SLOTS, RANK = 4, 16
NEW_TOKENS = 8
# Entries of A and B ~ N(0, scale): scale * (16 / r) ** 0.25 changes a few of SmolLM2's first greedy tokens without
# turning them into noise (near-ties would make greedy equality a coin toss).
AT_START = {
    "sql": AdapterSpec(1, 16, ALL_TARGETS, 0.06),
    "chat": AdapterSpec(2, 8, ["q_proj", "k_proj", "v_proj", "o_proj"], 0.07),
    "math": AdapterSpec(3, 4, ALL_TARGETS, 0.085, use_rslora=True),
}
AT_RUNTIME = {
    "poem": AdapterSpec(4, 16, ["q_proj", "v_proj", "gate_proj", "down_proj"], 0.06),
    "code": AdapterSpec(5, 2, ALL_TARGETS, 0.1),
}
REFERENCES: dict[tuple, list[int]] = {}  # (adapter, prompt) -> transformers + peft's tokens
QUESTIONS = [f"Name {n} things that are {c}." for n in (2, 3, 4) for c in ("red", "round", "cold", "loud", "soft")]


@pytest.fixture(scope="module")
def lora_export(tmp_path_factory):
    directory = tmp_path_factory.mktemp("smollm2-lora") / "artifact"
    result = run_export(
        "--model", smollm2_gguf(), "--batch-size", SLOTS, "--sequence-length", 256, "--prefill-chunk-size", 32,
        "--context-buckets", "256", "--prefill-buckets", "0,256", "--decode-batch-sizes", SLOTS,
        "--max-loras", SLOTS, "--max-lora-rank", RANK, "--backend", "cpu", directory, timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return directory


@pytest.fixture(scope="module")
def peft_model(adapters_root):
    """SmolLM2 from the same GGUF (fp32) with all five adapters, each saved in adapters/<name>."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf()
    with gguf_read_once():
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    return make_adapters(hf, adapters_root, {**AT_START, **AT_RUNTIME})


@pytest.fixture(scope="module")
def adapters_root(tmp_path_factory):
    return tmp_path_factory.mktemp("smollm2-adapters")


@pytest.fixture(scope="module")
def server(lora_export, peft_model, adapters_root, tmp_path_factory):
    modules = [f"{name}={adapters_root / name}" for name in AT_START]
    log = tmp_path_factory.mktemp("smollm2-lora-serve") / "serve.log"
    yield from serve(
        lora_export, log, "--enable-lora", "--max-loras", str(SLOTS), "--max-lora-rank", str(RANK),
        "--lora-modules", *modules, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}, timeout=600,
    )  # fmt: skip


def chat_ids(question: str) -> list[int]:
    tokenizer = smollm2_tokenizer()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def reference(peft_model, name: str | None, prompt: list[int]) -> list[int]:
    """transformers + peft: the adapter `name`'s greedy tokens (None: the base model's)."""
    key = (name, tuple(prompt))
    if key not in REFERENCES:
        if name is None:
            with peft_model.disable_adapter():
                REFERENCES[key] = hf_greedy_cached(peft_model, prompt, NEW_TOKENS)
        else:
            peft_model.set_adapter(name)
            REFERENCES[key] = hf_greedy_cached(peft_model, prompt, NEW_TOKENS)
    return REFERENCES[key]


def completion(server, name: str | None, prompt: list[int]) -> tuple[int, dict]:
    return call(server.port, "/v1/completions", greedy(name or server.model, prompt, NEW_TOKENS))


def answers(server, jobs: list[tuple[str | None, list[int]]], workers: int) -> list[tuple[int, dict]]:
    return concurrently(lambda job: completion(server, *job), jobs, workers)


def assert_equal_peft(peft_model, jobs, results) -> None:
    for (name, prompt), (status, body) in zip(jobs, results, strict=True):
        assert status == 200, (name, body)
        assert body["choices"][0]["token_ids"] == reference(peft_model, name, prompt), name


def test_base_and_three_adapters_in_one_batch_equal_peft(server, peft_model):
    """Four requests, four rows: the base model and the three adapters loaded at startup at once."""
    prompt = chat_ids("Describe the sea in one sentence.")
    jobs = [(name, prompt) for name in (None, *AT_START)]
    assert_equal_peft(peft_model, jobs, answers(server, jobs, len(jobs)))
    base = reference(peft_model, None, prompt)
    assert all(reference(peft_model, name, prompt) != base for name in AT_START)  # each adapter changes the tokens


def test_two_more_adapters_loaded_under_load_swap_through_the_slots(server, peft_model, adapters_root):
    """While requests on the base model and the first three adapters run, a fourth and a fifth adapter are loaded;
    then requests on all six models at once: five adapters on four slots swap in and out, no request fails."""
    names = [None, *AT_START]
    running = [(names[i % len(names)], chat_ids(q)) for i, q in enumerate(QUESTIONS[:6])]
    done: list = []
    background = threading.Thread(target=lambda: done.extend(answers(server, running, 4)))
    background.start()
    for name in AT_RUNTIME:
        path = str(adapters_root / name)
        status, text = text_call(server.port, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        assert status == 200, text
    mixed_names = [*AT_RUNTIME, *names]
    mixed = [(mixed_names[i % len(mixed_names)], chat_ids(q)) for i, q in enumerate(QUESTIONS[6:12])]
    results = answers(server, mixed, 6)
    background.join(timeout=600)
    assert not background.is_alive()
    assert_equal_peft(peft_model, running + mixed, done + results)
