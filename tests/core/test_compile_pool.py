"""Compile workers and resumable exports on the cpu backend: a parallel export writes the serial export's graph files
byte for byte, an interrupted export compiles only the graphs it had not finished, and each graph prints a progress
line (done / total, time per graph, time left)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from support.tiny_models import save_tiny

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.backends.compile_pool import CompileOptions
from optimum_neuron_plugin.backends.program_cache import CACHE_ENV

from .helpers import CHUNKED_LOGITS, VOCAB

PROGRESS = re.compile(
    r"^\[(\d+)/(\d+)\] graph (\S+): compiled in [\d.]+ s \([\d.]+ s per graph so far, about \d+ s left\)$"
)
# Six graphs (one context bucket, prefill buckets 0 and 64, token_generation of 1 and 3 rows): what a pool and a
# resume do does not depend on the count.
SHAPE = dict(CHUNKED_LOGITS, context_buckets=(64,), prefill_buckets=(0, 64))
GRAPHS = 6
STOP_AFTER = 3
REUSED = re.compile(r"^\[(\d+)/(\d+)\] graph (\S+): reused \(compiled by an earlier export\)$")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("hf") / "llama", "llama", seed=21, vocab_size=VOCAB)


@pytest.fixture(autouse=True)
def no_shared_cache(monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)  # every graph compiled by the export under test


@pytest.fixture(scope="module")
def serial(source, tmp_path_factory) -> dict[str, bytes]:
    """The graph files of the export by one process, every graph compiled (the reference of both tests)."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv(CACHE_ENV, raising=False)
        return _export(source, tmp_path_factory.mktemp("serial") / "artifact", CompileOptions(workers=1))


def _graph_files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted((directory / "graphs").rglob("*")) if p.is_file()
    }


def _export(source: Path, output: Path, options: CompileOptions, progress=None) -> dict[str, bytes]:
    model = NeuronModelForCausalLM.export(source, NeuronConfig(**SHAPE), progress=progress, options=options)
    model.save_pretrained(output)
    return _graph_files(output)


def test_two_workers_write_the_serial_graph_files_byte_for_byte(source, serial, tmp_path):
    lines: list[str] = []
    parallel = _export(source, tmp_path / "parallel", CompileOptions(workers=2), lines.append)
    assert len(serial) == GRAPHS and parallel == serial
    assert f"compiling {GRAPHS} graph(s) in 2 worker processes" in lines
    progress = [PROGRESS.match(line) for line in lines if line.startswith("[")]
    assert all(progress) and sorted(int(m[1]) for m in progress) == list(range(1, GRAPHS + 1))
    assert {m[2] for m in progress} == {str(GRAPHS)}


def test_an_interrupted_export_resumes_and_compiles_only_the_rest(source, serial, tmp_path, monkeypatch):
    resume = tmp_path / "resume"
    traced = []
    export = torch.export.export

    def counted(*args, **kwargs):
        traced.append(args[0].spec.key)
        return export(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)

    def stop_early(line: str) -> None:
        if PROGRESS.match(line) and int(PROGRESS.match(line)[1]) == STOP_AFTER:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _export(source, tmp_path / "first", CompileOptions(workers=1, resume_dir=resume), stop_early)
    first = list(traced)
    assert len(first) == STOP_AFTER and len(list(resume.iterdir())) == STOP_AFTER
    lines: list[str] = []
    resumed = _export(source, tmp_path / "second", CompileOptions(workers=1, resume_dir=resume), lines.append)
    assert len(traced) - len(first) == GRAPHS - STOP_AFTER and not set(traced[STOP_AFTER:]) & set(first)
    assert [REUSED.match(line)[3] for line in lines if REUSED.match(line)] == first
    assert resumed == serial
