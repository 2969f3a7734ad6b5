"""The neuron backend's plumbing with a stand-in compiler registered under TorchNeuron's backend name ("neuron"),
on the cpu device: each graph compiled once at export, its cache files in the artifact, a reload that compiles
nothing, the KV cache updated in place; and the errors on a host without the Neuron SDK or devices."""

from __future__ import annotations

import json
import shutil
import tempfile

import pytest
import torch

from optimum_neuron_plugin import ArtifactError, ExportError, NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.backends import neuron
from optimum_neuron_plugin.backends.cpu import CpuBackend
from optimum_neuron_plugin.graphs import example_inputs, graph_specs
from optimum_neuron_plugin.torch_compat import register_compile_backend, unregister_compile_backend
from tests.neuron.fake_compiler import FakeNeuronCompiler

CONFIG = dict(backend="neuron", batch_size=2, sequence_length=32, prefill_chunk_size=8, torch_dtype="bfloat16")
NO_SDK = pytest.mark.skipif(neuron.neuron_core_count() > 0, reason="this host has NeuronCores and torch-neuronx")


def test_each_graph_compiled_once_cached_in_the_artifact_and_reloaded_without_compiling(
    tiny_models, fake_neuron_compiler, tmp_path, caplog
):
    config = NeuronConfig(**CONFIG)
    model, specs = tiny_models["llama"], graph_specs(config, tiny_models["llama"].args.vocab_size)
    backend = neuron.NeuronBackend(config, device="cpu")
    backend.check_can_compile()
    workdir = tmp_path / "export"
    backend.compile(model.graphs(config), model.params(config), model.caches(config), workdir, lambda m: None)
    # The neuron defaults: chunked_prefill x 4 prefill buckets, token_generation x 3 decode buckets (batch_size rows),
    # chunk_and_decode x 2 context buckets
    assert len(fake_neuron_compiler.compiled) == len(specs) == 9
    files = backend.graph_files(workdir, specs)
    cache_files = [p for p in files if neuron.CACHE_DIR in p.parts]
    assert len(cache_files) == len(specs) and all(p.is_file() for p in files)
    manifest = json.loads((workdir / "graphs" / f"{specs[0].key}.neuron.json").read_text())
    assert manifest["graph"] == specs[0].key and len(manifest["cache_files"]) == 1

    # What save_pretrained does: copy the listed files into the artifact. Then load it elsewhere.
    artifact = tmp_path / "artifact"
    for path in files:
        (artifact / path.relative_to(workdir)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, artifact / path.relative_to(workdir))
    shutil.rmtree(workdir)
    torch.compiler.reset()  # as in a new process (vllm serve): Dynamo traces again, the compiler sees each graph
    caches = model.caches(config)
    loaded = backend.load(model.graphs(config), model.params(config), caches, artifact)
    for spec in specs:
        loaded(spec, *example_inputs(spec))
    assert len(fake_neuron_compiler.compiled) == len(specs)  # nothing compiled again
    assert len(fake_neuron_compiler.hits) == len(specs)
    assert "compiled at load time" not in caplog.text
    assert str(artifact / "graphs" / neuron.CACHE_DIR) == neuron.os.environ[neuron.CACHE_ENV]


def test_outputs_match_the_cpu_backend_and_the_cache_is_updated_in_place(tiny_models, fake_neuron_compiler, tmp_path):
    config = NeuronConfig(**{**CONFIG, "torch_dtype": "float32"})
    model, specs = tiny_models["qwen3"], graph_specs(config, tiny_models["qwen3"].args.vocab_size)
    prefill = specs[0]
    device = neuron.NeuronBackend(config, device="cpu").load(
        model.graphs(config), model.params(config), model.caches(config), tmp_path
    )
    reference_caches = model.caches(config)
    cpu = NeuronConfig(**{**CONFIG, "torch_dtype": "float32", "backend": "cpu", "cpu_compiler": "export"})
    CpuBackend(cpu).compile([model.graphs(config)[0]], model.params(config), reference_caches, tmp_path, print)
    reference = CpuBackend(cpu).load([model.graphs(config)[0]], model.params(config), reference_caches, tmp_path)
    ids = torch.arange(8, dtype=torch.int32)[None] * 7
    width = config.blocks_per_sequence
    positions = torch.arange(8, dtype=torch.int32)[None]
    table = torch.arange(width + 1, 2 * width + 1, dtype=torch.int32)[None]  # a second sequence's blocks
    cache_before = device.caches[0]
    # Equal up to rounding: the CPU backend computes small-row linears weight-major (backends/cpu.py).
    torch.testing.assert_close(device(prefill, ids, positions, table), reference(prefill, ids, positions, table))
    first = int(table[0, 0])  # positions 0..7: the first block (block_size 8)
    assert config.block_size == 8 and device.caches[0] is cache_before and cache_before[first].abs().sum() > 0
    for mine, theirs in zip(device.caches, reference_caches, strict=True):
        torch.testing.assert_close(mine, theirs)


@NO_SDK
def test_without_the_sdk_export_and_load_fail_with_one_line_naming_the_packages(tmp_path):
    config = NeuronConfig(**CONFIG)
    with pytest.raises(ExportError) as raised:
        neuron.NeuronBackend(config).check_can_compile()
    message = str(raised.value)
    assert "torch-neuronx and neuronx-cc" in message and '".[neuron]"' in message and "--backend cpu" in message
    assert "\n" not in message
    with pytest.raises(ArtifactError, match=r"needs torch-neuronx \(not installed\)"):
        neuron.NeuronBackend(config).load([], {}, [], tmp_path)


@NO_SDK
def test_runtime_export_without_the_sdk_writes_nothing(tiny_models, tmp_path, monkeypatch):
    source = tmp_path / "hf"
    tiny_models["llama"].hf.save_pretrained(source)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(ExportError, match="torch-neuronx"):
        NeuronModelForCausalLM.export(source, NeuronConfig(**CONFIG))
    assert list(scratch.iterdir()) == []


def test_an_unregistered_compiler_is_named(tmp_path):
    backend = neuron.NeuronBackend(NeuronConfig(**CONFIG), compiler="no_such_compiler", device="cpu")
    with pytest.raises(ExportError, match="no torch.compile backend named 'no_such_compiler'.*torch-neuronx"):
        backend.check_can_compile()


def test_artifacts_built_for_another_target_or_compiler_are_refused(tmp_path):
    built = {"target": "trn3", "logical_nc_config": "2", "torch_neuronx": "2.13.3.0", "neuronx_cc": "2.23.1"}
    built |= {"neuron_cc_flags": "", "opt_level": "-O2"}
    NeuronConfig(**CONFIG).save(tmp_path, compiler=built)
    host = {**built, "target": "trn2"}
    with pytest.raises(ArtifactError, match=r"compiled with target trn3, this host has trn2; export the model again"):
        neuron._check_compiled_here(tmp_path, host)
    with pytest.raises(ArtifactError, match="neuronx-cc 2.23.1, this host has 2.24.0"):
        neuron._check_compiled_here(tmp_path, {**built, "neuronx_cc": "2.24.0"})
    neuron._check_compiled_here(tmp_path, dict(built))


@NO_SDK
def test_a_tensor_parallel_export_needs_one_visible_core_per_rank():
    """(Tensor parallelism itself: tests/neuron/test_tensor_parallel.py.)"""
    with pytest.raises(ExportError, match=r"tp_degree=2 compiles on 2 NeuronCores \(one process each\) but 0 are"):
        neuron._require_tp_cores(2)


def test_a_graph_missing_from_the_artifact_cache_is_reported_at_load(
    tiny_models, fake_neuron_compiler, tmp_path, caplog
):
    config = NeuronConfig(**CONFIG)
    model, spec = tiny_models["mistral"], graph_specs(config, tiny_models["mistral"].args.vocab_size)[0]
    loaded = neuron.NeuronBackend(config, device="cpu").load(
        model.graphs(config), model.params(config), model.caches(config), tmp_path
    )
    loaded(spec, *example_inputs(spec))
    assert f"graph {spec.key} was not in" in caplog.text and "export again" in caplog.text


def test_serving_with_other_compiler_options_than_the_export_is_refused_with_what_to_set(
    stand_in_sdk, tmp_path, monkeypatch
):
    """TorchNeuron's NEFF cache key holds NEURON_CC_FLAGS as it is and the opt level: neuron_config.json records
    both, and serving compares them as the key does. An unset, an empty and a padded NEURON_CC_FLAGS are three keys."""
    config = NeuronConfig(**CONFIG)
    monkeypatch.setenv("NEURON_CC_FLAGS", "--enable-mixed-precision-accumulation")
    monkeypatch.delenv("NEURON_COMPILER_OPT_LEVEL", raising=False)
    exported = neuron.NeuronBackend(config).versions()  # what the export records under "compiler"
    assert (exported["neuron_cc_flags"], exported["opt_level"]) == ("--enable-mixed-precision-accumulation", "-O2")
    config.save(tmp_path, compiler=exported)

    def refusal() -> str:
        with pytest.raises(ArtifactError) as raised:
            neuron.NeuronBackend(config).load([], {}, [], tmp_path)
        return str(raised.value)

    monkeypatch.delenv("NEURON_CC_FLAGS")
    message = refusal()
    assert "compiled with NEURON_CC_FLAGS='--enable-mixed-precision-accumulation', this process has unset" in message
    assert "run vllm serve with `export NEURON_CC_FLAGS=--enable-mixed-precision-accumulation;`" in message
    monkeypatch.setenv("NEURON_CC_FLAGS", " --enable-mixed-precision-accumulation ")
    assert "this process has ' --enable-mixed-precision-accumulation '" in refusal()
    monkeypatch.setenv("NEURON_CC_FLAGS", "--enable-mixed-precision-accumulation")
    monkeypatch.setenv("NEURON_COMPILER_OPT_LEVEL", "-O1")
    assert "compiled with NEURON_COMPILER_OPT_LEVEL='-O2', this process has '-O1'" in refusal()
    monkeypatch.setenv("NEURON_COMPILER_OPT_LEVEL", "-O2")  # TorchNeuron's default, set: the same key
    neuron._check_compiled_here(tmp_path, neuron.NeuronBackend(config).versions())


def test_an_export_without_neuron_cc_flags_is_served_only_without_them(stand_in_sdk, tmp_path, monkeypatch):
    """Unset, NEURON_CC_FLAGS adds nothing to the key; set to "", it adds a separator (another key)."""
    config = NeuronConfig(**CONFIG)
    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    config.save(tmp_path, compiler=neuron.NeuronBackend(config).versions())
    monkeypatch.setenv("NEURON_CC_FLAGS", "")
    with pytest.raises(ArtifactError) as raised:
        neuron.NeuronBackend(config).load([], {}, [], tmp_path)
    assert "compiled with NEURON_CC_FLAGS=unset, this process has ''" in str(raised.value)
    assert "run vllm serve with `unset NEURON_CC_FLAGS;`" in str(raised.value)


def test_the_options_part_of_the_cache_key_is_torchneurons():
    """CreateCompilerExtensionHash (csrc/core/KernelExecution.cpp): "<opt level without its dash>_<arguments>", the
    arguments being "--model-type transformer --auto-cast=none" then " " + NEURON_CC_FLAGS when it is set, with
    spaces written "_" and "=" written "-"."""
    key = neuron.cache_key_options
    assert key({"neuron_cc_flags": None, "opt_level": "-O2"}) == "O2_--model-type_transformer_--auto-cast-none"
    assert key({"neuron_cc_flags": "", "opt_level": "-O2"}) == "O2_--model-type_transformer_--auto-cast-none_"
    assert key({"neuron_cc_flags": "-x=1", "opt_level": "-O1"}) == "O1_--model-type_transformer_--auto-cast-none_-x-1"


def test_a_graph_whose_neff_is_not_in_the_artifact_fails_the_export_naming_it(tiny_models, tmp_path, monkeypatch):
    """TorchNeuron reads its NEFF cache directory once per process: a cache created before the export pointed it at
    the artifact writes the NEFFs elsewhere, and the artifact would hold none."""
    if "neuron" in torch.compiler.list_backends(exclude_tags=()):
        pytest.skip("torch-neuronx is installed: the real `neuron` Dynamo backend is registered")
    monkeypatch.setenv(neuron.CACHE_ENV, "unset")
    compiler = FakeNeuronCompiler(cache_dir=tmp_path / "cache-created-earlier")
    register_compile_backend(compiler, "neuron")
    try:
        config = NeuronConfig(**CONFIG)
        model, specs = tiny_models["llama"], graph_specs(config, tiny_models["llama"].args.vocab_size)
        backend = neuron.NeuronBackend(config, device="cpu")
        with pytest.raises(ExportError) as raised:
            backend.compile(model.graphs(config), model.params(config), model.caches(config), tmp_path / "w", print)
    finally:
        unregister_compile_backend("neuron")
        torch.compiler.reset()
    assert str(raised.value).startswith(f"compiling graph {specs[0].key} left no .neff in {tmp_path / 'w'}")
    assert len(compiler.compiled) == 1  # the export stopped at the first graph


def test_an_export_on_a_host_without_neuron_cores_says_why_it_cannot_compile_there(stand_in_sdk, monkeypatch):
    monkeypatch.setattr(neuron, "neuron_devices_present", lambda: False)  # the SDK installed on a CPU instance
    with pytest.raises(ExportError) as raised:
        neuron.NeuronBackend(NeuronConfig(**CONFIG, target="trn2")).check_can_compile()
    message = str(raised.value)
    assert message.startswith("an export with --backend neuron compiles on the device host, --instance-type or not")
    assert "no CPU compile mode" in message and "no NeuronCore is visible on this host" in message
