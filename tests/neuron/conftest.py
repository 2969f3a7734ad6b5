"""Fixtures for the neuron backend tests: tiny models, their weights, and a stand-in `neuron` compiler."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support.tiny_models import tiny_model

from optimum_neuron_plugin import artifact, devices
from optimum_neuron_plugin.backends import neuron
from optimum_neuron_plugin.backends.neuron import CACHE_ENV
from optimum_neuron_plugin.config import NeuronConfig
from optimum_neuron_plugin.graphs import DecoderGraph, graph_specs
from optimum_neuron_plugin.models.args import ModelArgs
from optimum_neuron_plugin.models.checkpoint import decoder_weights
from optimum_neuron_plugin.models.kv_cache import empty_cache
from optimum_neuron_plugin.runtime.artifact_io import to_params as _to_params
from optimum_neuron_plugin.torch_compat import register_compile_backend, unregister_compile_backend
from tests.core.helpers import SEEDS, VOCAB
from tests.neuron.fake_compiler import FakeNeuronCompiler
from tests.neuron.stand_in.torch_neuronx import RUNTIME_LOG_ENV

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "granite", "phi3", "smollm3")
MOE_ARCHITECTURES = (
    "qwen3_moe",
    "mixtral",
    "gpt_oss",
)  # fewer graphs each in the tests (their exports hold more weights)
STAND_IN = Path(__file__).parent / "stand_in"  # torch_neuronx and neuronxcc stand-ins


@dataclass
class TinyModel:
    args: ModelArgs
    hf: torch.nn.Module
    state_dict: dict[str, torch.Tensor]

    def params(self, config: NeuronConfig) -> dict[str, torch.Tensor]:
        return _to_params(self.state_dict, self.args, artifact.torch_dtype(config))

    def graphs(self, config: NeuronConfig) -> list[DecoderGraph]:
        return [DecoderGraph(self.args, spec, config.max_topk) for spec in graph_specs(config, self.args.vocab_size)]

    def caches(self, config: NeuronConfig) -> list[torch.Tensor]:
        a = self.args
        return empty_cache(
            a.num_hidden_layers, config.num_blocks, config.block_size, a.num_key_value_heads, a.head_dim,
            artifact.torch_dtype(config),
        )  # fmt: skip


def build_tiny(name: str) -> TinyModel:
    hf = tiny_model(name, seed=SEEDS[name], vocab_size=VOCAB)
    config = {**hf.config.to_dict(), "architectures": [type(hf).__name__]}
    args = ModelArgs.from_hf_config(config)
    return TinyModel(args, hf, decoder_weights(hf.state_dict(), args))  # as sources.load_source reads it


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, TinyModel]:
    return {name: build_tiny(name) for name in ARCHITECTURES + MOE_ARCHITECTURES}


@pytest.fixture
def fake_neuron_compiler(monkeypatch):
    """Registers the fake under TorchNeuron's Dynamo backend name, "neuron", for one test."""
    if "neuron" in torch.compiler.list_backends(exclude_tags=()):
        pytest.skip("torch-neuronx is installed: the real `neuron` Dynamo backend is registered")
    monkeypatch.setenv(CACHE_ENV, "unset")  # restored after the test: the backend sets it
    compiler = FakeNeuronCompiler()
    register_compile_backend(compiler, "neuron")
    yield compiler
    unregister_compile_backend("neuron")
    torch.compiler.reset()


@pytest.fixture
def stand_in_sdk(monkeypatch, tmp_path) -> Path:
    """A trn2 host as the plugin sees it, for one test: the stand-in torch_neuronx and neuronxcc importable, 8
    NeuronCores present (ONP_TEST_PLATFORM_TARGET=trn3 makes it a trn3), NEURON_RT_VISIBLE_CORES unset. Yields the stand-in runtime's log (who started it)."""
    if importlib.util.find_spec("torch_neuronx") is not None:
        pytest.skip("torch-neuronx is installed: the stand-in would shadow it")
    monkeypatch.syspath_prepend(str(STAND_IN))
    monkeypatch.setattr(neuron, "neuron_devices_present", lambda: True)
    monkeypatch.setattr(devices, "neuron_devices_present", lambda: True)
    log = tmp_path / "nrt.log"
    monkeypatch.setenv(RUNTIME_LOG_ENV, str(log))
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "")  # restored after the test, whatever pin_cores writes
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES")
    yield log
    for name in [m for m in sys.modules if m.split(".")[0] in ("torch_neuronx", "neuronxcc")]:
        del sys.modules[name]
