"""The compile cache: a compiled graph is reused by any later export whose graph and compiler are the same.

A graph's compiled files depend on the model's shape (ModelArgs), the graph's spec, the weights' and caches' shapes
and dtypes, this package's graph code and the compiler's identity (its versions, flags and target: the backend's
compiler_identity), never on weight values (weights are inputs): re-exporting a fine-tune, or the same shape with
other options, copies the files it already compiled instead of compiling them again. An entry is a directory
named by that key holding the graph's files at their paths in the export's working directory; it is written
whole (renamed into place), so an entry is complete or absent.

Two places are looked in: the directory the export keeps beside its output while it runs (an interrupted export
resumes from it) and, on the cpu backend, the cache shared by every export that ONP_CPU_COMPILE_CACHE names (the
neuron backend has TorchNeuron's own NEFF cache for that).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import shutil
from pathlib import Path

import torch

from ..graphs import DecoderGraph

CACHE_ENV = "ONP_CPU_COMPILE_CACHE"
# The code a program is traced from: a change to any of these files is a new program.
_PACKAGE = Path(__file__).resolve().parents[1]
_CODE = (
    "config.py",
    "graphs.py",
    "models",
    "torch_compat.py",
    "backends/cpu.py",
    "backends/cpu_serde.py",
    "backends/cpu_graph_record.py",
)


class ProgramCache:
    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots

    @classmethod
    def from_env(cls, resume_dir: Path | None = None, shared: bool = True) -> ProgramCache:
        """resume_dir, then the shared cache ONP_CPU_COMPILE_CACHE names when `shared`."""
        root = os.environ.get(CACHE_ENV) if shared else None
        return cls([path for path in (resume_dir, Path(root) if root else None) if path is not None])

    def key(self, graph: DecoderGraph, params: dict, caches: list[torch.Tensor], identity: tuple) -> str | None:
        """The graph's identity, or None when it is not cacheable (tensor-parallel programs name their group)."""
        if not self.roots or graph.cc.degree > 1:
            return None
        args = dataclasses.replace(graph.args, eos_token_ids=[])
        shapes = [(name, tuple(t.shape), str(t.dtype)) for name, t in sorted(params.items())]
        shapes += [(tuple(t.shape), str(t.dtype)) for t in caches]
        whole = (_code_digest(), torch.__version__, identity, args, graph.spec, graph.max_topk, shapes)
        return hashlib.sha256(repr(whole).encode()).hexdigest()

    def fetch(self, key: str | None, directory: Path) -> bool:
        """Copies the entry's files into directory; False when no root holds it."""
        if key is None:
            return False
        for root in self.roots:
            entry = root / key
            if entry.is_dir():
                for source in sorted(p for p in entry.rglob("*") if p.is_file()):
                    target = Path(directory) / source.relative_to(entry)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, target)
                return True
        return False

    def store(self, key: str | None, directory: Path, files: list[str]) -> None:
        """Keeps the graph's files (relative to directory) under key in every root."""
        if key is None:
            return
        for root in self.roots:
            if (root / key).is_dir():
                continue
            staging = root / f".{key}.{os.getpid()}"
            for name in files:
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(directory) / name, staging / name)
            staging.mkdir(parents=True, exist_ok=True)
            os.replace(staging, root / key)  # atomic: a concurrent export sees the whole entry or none


@functools.cache
def _code_digest() -> str:
    digest = hashlib.sha256()
    for entry in _CODE:
        path = _PACKAGE / entry
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(source.read_bytes())
    return digest.hexdigest()
