"""The CPU backend's compile cache: an exported program is reused by any later export whose graph is the same.

A program depends on the model's shape (ModelArgs), the graph's spec, the weights' and caches' shapes and dtypes,
this package's graph code and torch, never on weight values (weights are inputs): re-exporting a fine-tune, or
the same shape with other options, copies the programs it already compiled instead of tracing them again, as
TorchNeuron's NEFF cache does for the neuron backend. Off unless ONP_CPU_COMPILE_CACHE names a directory.
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
_CODE = ("config.py", "graphs.py", "models", "backends/cpu.py", "backends/cpu_serde.py", "backends/cpu_graph_record.py")


class ProgramCache:
    def __init__(self, root: Path | None) -> None:
        self.root = root

    @classmethod
    def from_env(cls) -> ProgramCache:
        root = os.environ.get(CACHE_ENV)
        return cls(Path(root) if root else None)

    def key(self, graph: DecoderGraph, params: dict, caches: list[torch.Tensor], suffix: str) -> str | None:
        """The program's identity, or None when it is not cacheable (tensor-parallel programs name their group)."""
        if self.root is None or graph.cc.degree > 1:
            return None
        args = dataclasses.replace(graph.args, eos_token_ids=[])
        shapes = [(name, tuple(t.shape), str(t.dtype)) for name, t in sorted(params.items())]
        shapes += [(tuple(t.shape), str(t.dtype)) for t in caches]
        identity = (_code_digest(), torch.__version__, suffix, args, graph.spec, graph.max_topk, shapes)
        return hashlib.sha256(repr(identity).encode()).hexdigest()

    def fetch(self, key: str | None, target: Path) -> bool:
        """Copies the cached program to target; False when there is none."""
        if key is None or not (self.root / key).is_file():
            return False
        shutil.copyfile(self.root / key, target)
        return True

    def store(self, key: str | None, program: Path) -> None:
        if key is None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".{key}.{os.getpid()}"
        shutil.copyfile(program, staging)
        os.replace(staging, self.root / key)  # atomic: a concurrent export sees the whole file or none


@functools.cache
def _code_digest() -> str:
    digest = hashlib.sha256()
    for entry in _CODE:
        path = _PACKAGE / entry
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(source.read_bytes())
    return digest.hexdigest()
