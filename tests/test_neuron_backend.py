"""The neuron backend on a host without the Neuron SDK: clear errors, nothing written.

torch-neuronx / neuronx-distributed are not installable here, so these tests check the failure paths; the
compile and load paths themselves need the SDK and a Neuron device.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest
import torch
from support.tiny_models import COMMON

from optimum_neuron_plugin import ArtifactError, ExportError, NeuronConfig
from optimum_neuron_plugin.backends import neuron

SDK_INSTALLED = any(importlib.util.find_spec(m) for m in ("torch_neuronx", "neuronx_distributed"))
needs_no_sdk = pytest.mark.skipif(SDK_INSTALLED, reason="the Neuron SDK is installed on this host")

TINY = dict(COMMON, vocab_size=128, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A random-weight Llama without tokenizer (the export does not need one)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY)).save_pretrained(directory)
    return directory


def neuron_config(**overrides) -> NeuronConfig:
    values = dict(batch_size=2, sequence_length=64, prefill_chunk_size=16, torch_dtype="bfloat16", target="trn1")
    return NeuronConfig(backend="neuron", **{**values, **overrides})


def files_under(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


def assert_names_missing_sdk(message: str) -> None:
    assert "torch-neuronx" in message and "neuronx-distributed" in message
    assert "https://pip.repos.neuron.amazonaws.com" in message and "DLAMI" in message
    assert "\n" not in message


@needs_no_sdk
def test_runtime_export_without_sdk_raises_and_writes_nothing(tiny_llama, tmp_path, monkeypatch):
    from optimum_neuron_plugin import NeuronModelForCausalLM

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(ExportError) as raised:
        NeuronModelForCausalLM.export(tiny_llama, neuron_config())
    assert_names_missing_sdk(str(raised.value))
    assert "--backend cpu" in str(raised.value)
    assert files_under(scratch) == []


@needs_no_sdk
def test_exporter_without_sdk_raises_and_writes_nothing(tiny_llama, tmp_path, monkeypatch):
    from exporter.cli import ExportRequest
    from exporter.export import export

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    output = tmp_path / "out" / "model"
    request = ExportRequest(model=str(tiny_llama), neuron_config=neuron_config(), output=output, overwrite=False)
    with pytest.raises(ExportError) as raised:
        export(request, progress=lambda message: None)
    assert_names_missing_sdk(str(raised.value))
    assert not output.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]  # no output, no staging directory
    assert files_under(scratch) == []


def test_tensor_parallel_is_refused_before_anything(tmp_path):
    with pytest.raises(ExportError, match=r"tp_degree=2 .*--tensor-parallel-size 1"):
        neuron.NeuronBackend(neuron_config(tp_degree=2)).compile([], {}, [], tmp_path, print)
    assert list(tmp_path.iterdir()) == []


@needs_no_sdk
def test_load_without_sdk_raises_artifact_error(tiny_llama, tmp_path):
    from optimum_neuron_plugin import NeuronModelForCausalLM, artifact, runtime, sources

    source = sources.load_source(tiny_llama)
    config = neuron_config()
    params = runtime._to_params(source.state_dict, source.args, artifact.torch_dtype(config))
    artifact.save_config({**source.hf_config, "architectures": [source.args.architecture]}, tmp_path)
    artifact.save_weights(params, tmp_path)
    config.save(tmp_path)
    # A placeholder file: the SDK check comes before reading it.
    for path in neuron.NeuronBackend(config).graph_files(tmp_path, []):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    with pytest.raises(ArtifactError) as raised:
        NeuronModelForCausalLM.from_pretrained(tmp_path)
    assert_names_missing_sdk(str(raised.value))
    assert "neuronx-cc" not in str(raised.value)  # not needed to run


def test_compiler_args_and_files(tmp_path, monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    tkg = neuron.compiler_args("token_generation", "trn2")
    assert "--target trn2" in tkg and "--lnc=2" in tkg and "-O2" in tkg and "--auto-cast=none" in tkg
    assert "--lnc=1" in neuron.compiler_args("chunked_prefill", "trn1")
    assert neuron.TARGETS["trn1n"] == "trn1"
    backend = neuron.NeuronBackend(neuron_config())
    assert backend.graph_files(tmp_path, []) == [tmp_path / "graphs" / "nxd_model.pt"]
    assert backend.versions()["name"] == "neuronx-cc"


def test_device_decoder_matches_the_graph_and_updates_its_cache():
    """The wrapper traced for Neuron runs the shared DecoderGraph and keeps the cache as reassigned buffers."""
    from optimum_neuron_plugin.graphs import DecoderGraph, graph_specs
    from optimum_neuron_plugin.models.args import ModelArgs
    from optimum_neuron_plugin.models.kv_cache import empty_cache
    from optimum_neuron_plugin.models.llama import weight_names

    args = ModelArgs.from_hf_config({**TINY, "architectures": ["LlamaForCausalLM"], "rms_norm_eps": 1e-5})
    config = neuron_config(torch_dtype="float32")
    torch.manual_seed(0)
    params = {n: torch.randn(p.shape) * 0.1 for n, p in _shapes(args, weight_names(args)).items()}
    make_caches = lambda: empty_cache(2, 2, 64, 2, args.head_dim, torch.float32)  # noqa: E731
    specs = graph_specs(config)
    decoder = neuron.DeviceDecoder([DecoderGraph(args, s, config.max_topk) for s in specs], params, make_caches())
    assert set(decoder.checkpoint()) == set(params) | {f"graphs.{s.key}.inv_freq" for s in specs}
    reference, caches = DecoderGraph(args, specs[0], config.max_topk), make_caches()
    ids, positions, seq = torch.arange(16)[None] % 128, torch.arange(16)[None], torch.tensor([1])
    decoder.active = specs[0].key
    assert torch.equal(decoder(ids, positions, seq), reference(params, caches, ids, positions, seq))
    for i, cache in enumerate(caches):
        assert torch.equal(getattr(decoder, f"kv_cache_{i}"), cache)
    assert caches[0][1, :16].abs().sum() > 0


def _shapes(args, names):
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**TINY))
    state = model.state_dict()
    return {n: state[n] for n in names}
