"""Compile workers on the neuron backend, through the stand-in compiler (tests/neuron/fake_compiler.py).

TorchNeuron compiles a graph at its first call on the device, in the calling process, and keeps the NEFF in a
persistent cache whose directory it reads once per process (CACHE_ENV; backends/neuron.py cites the sources). So a
compile worker is a process of its own, pinned to its own NeuronCore, with a NEFF cache of its own; each graph's new
cache files move to the artifact's cache and its manifest lists them. The artifact is the serial export's, byte for
byte, and every graph is compiled once."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest
import torch
from support.tiny_models import save_tiny

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.backends import neuron
from optimum_neuron_plugin.backends.compile_pool import CompileOptions
from optimum_neuron_plugin.backends.neuron import CACHE_ENV, EXPORT_CORES_ENV, NeuronBackend
from optimum_neuron_plugin.errors import ExportError
from tests.core.helpers import VOCAB
from tests.neuron.fake_compiler import FAKE, LOG_ENV, MODULE

# Four graphs (one context bucket, prefill buckets 0 and 32): two workers share them unevenly, as any count does.
SHAPE = dict(
    backend="neuron", batch_size=2, sequence_length=32, prefill_chunk_size=8, torch_dtype="bfloat16",
    context_buckets=(32,), prefill_buckets=(0, 32),
)  # fmt: skip
GRAPHS = 4
STAND_IN = partial(NeuronBackend, compiler=FAKE, device="cpu", compiler_module=MODULE)


def _export(source: Path, output: Path, options: CompileOptions) -> dict[str, bytes]:
    model = NeuronModelForCausalLM.export(source, NeuronConfig(**SHAPE), make_backend=STAND_IN, options=options)
    model.save_pretrained(output)
    return {str(p.relative_to(output)): p.read_bytes() for p in sorted((output / "graphs").rglob("*")) if p.is_file()}


def test_two_workers_write_the_serial_artifact_and_compile_each_graph_once(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "unset")  # restored after the test: the backend sets it
    log = tmp_path / "compiles.log"
    monkeypatch.setenv(LOG_ENV, str(log))
    source = save_tiny(tmp_path / "hf", "llama", seed=5, vocab_size=VOCAB)
    serial = _export(source, tmp_path / "serial", CompileOptions(workers=1))
    serial_compiles = log.read_text().splitlines()
    log.unlink()
    parallel = _export(source, tmp_path / "parallel", CompileOptions(workers=2))
    graphs = [name for name in serial if name.endswith(".neuron.json")]
    assert len(graphs) == GRAPHS and len(serial) == 2 * GRAPHS  # a manifest and a NEFF per graph
    assert parallel == serial
    compiles = log.read_text().splitlines()
    assert len(compiles) == len(serial_compiles) == GRAPHS and all(line.endswith(" compiled") for line in compiles)
    # The artifact serves: every graph is found in its NEFF cache (nothing compiled at load).
    log.unlink()
    torch.compiler.reset()  # as in a new process (vllm serve): Dynamo traces again, the compiler sees each graph
    model = NeuronModelForCausalLM.from_pretrained(tmp_path / "parallel", make_backend=STAND_IN)
    model.warm_up()
    loads = log.read_text().splitlines()
    assert len(loads) == GRAPHS and all(line.endswith(" hit") for line in loads)


def test_workers_take_the_cores_the_export_could_see(stand_in_sdk, fake_neuron_compiler, monkeypatch):
    """The export pins itself to its first core before the runtime starts; its workers take the others, one each,
    and more workers than those cores is refused."""
    monkeypatch.setenv(EXPORT_CORES_ENV, "")  # restored (absent) after the test, whatever the backend writes
    monkeypatch.delenv(EXPORT_CORES_ENV)
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "4-5")
    backend = NeuronBackend(NeuronConfig(**SHAPE))  # device "neuron" on the stand-in SDK
    backend.check_can_compile()
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "4" and os.environ[EXPORT_CORES_ENV] == "4,5"
    neuron._require_worker_cores(backend, 2)
    with pytest.raises(ExportError, match=r"--compile-workers 3 compiles on 3 NeuronCores .* but 2 are visible"):
        neuron._require_worker_cores(backend, 3)
