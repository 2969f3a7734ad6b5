"""Fixtures for the neuron backend tests: tiny models, their weights, and a stand-in `neuron` compiler."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from support.tiny_models import tiny_model
from torch._dynamo.backends import registry

from optimum_neuron_plugin import artifact
from optimum_neuron_plugin.backends.neuron import CACHE_ENV
from optimum_neuron_plugin.config import NeuronConfig
from optimum_neuron_plugin.graphs import DecoderGraph, graph_specs
from optimum_neuron_plugin.models.args import ModelArgs
from optimum_neuron_plugin.models.kv_cache import empty_cache
from optimum_neuron_plugin.runtime import _to_params
from tests.core.helpers import SEEDS, VOCAB

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class TinyModel:
    args: ModelArgs
    hf: torch.nn.Module
    state_dict: dict[str, torch.Tensor]

    def params(self, config: NeuronConfig) -> dict[str, torch.Tensor]:
        return _to_params(self.state_dict, self.args, artifact.torch_dtype(config))

    def graphs(self, config: NeuronConfig) -> list[DecoderGraph]:
        return [DecoderGraph(self.args, spec, config.max_topk) for spec in graph_specs(config)]

    def caches(self, config: NeuronConfig) -> list[torch.Tensor]:
        a = self.args
        return empty_cache(
            a.num_hidden_layers, config.batch_size, config.sequence_length, a.num_key_value_heads, a.head_dim,
            artifact.torch_dtype(config),
        )  # fmt: skip


def build_tiny(name: str) -> TinyModel:
    hf = tiny_model(name, seed=SEEDS[name], vocab_size=VOCAB)
    config = {**hf.config.to_dict(), "architectures": [type(hf).__name__]}
    return TinyModel(ModelArgs.from_hf_config(config), hf, hf.state_dict())


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, TinyModel]:
    return {name: build_tiny(name) for name in ARCHITECTURES}


@dataclass(eq=False)  # hashable: Dynamo's registry keys on the function
class FakeNeuronCompiler:
    """Stands in for TorchNeuron's Dynamo backend: one "NEFF" per distinct graph in the persistent cache
    directory TorchNeuron reads from CACHE_ENV, a cache hit when the file is there; runs the graph eagerly."""

    compiled: list[str] = field(default_factory=list)
    hits: list[str] = field(default_factory=list)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        signature = [(tuple(x.shape), str(x.dtype)) for x in example_inputs if isinstance(x, torch.Tensor)]
        key = hashlib.sha256((gm.code + repr(signature)).encode()).hexdigest()
        path = Path(os.environ[CACHE_ENV]) / key[:2] / f"{key}.neff"
        if path.is_file():
            self.hits.append(key)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(gm.code)
            self.compiled.append(key)
        return gm.forward


@pytest.fixture
def fake_neuron_compiler(monkeypatch):
    """Registers the fake under TorchNeuron's Dynamo backend name, "neuron", for one test."""
    if "neuron" in torch._dynamo.list_backends(exclude_tags=()):
        pytest.skip("torch-neuronx is installed: the real `neuron` Dynamo backend is registered")
    monkeypatch.setenv(CACHE_ENV, "unset")  # restored after the test: the backend sets it
    compiler = FakeNeuronCompiler()
    torch._dynamo.register_backend(compiler, name="neuron")
    yield compiler
    registry._COMPILER_FNS.pop("neuron", None)
    registry._BACKENDS.pop("neuron", None)
    torch._dynamo.reset()
