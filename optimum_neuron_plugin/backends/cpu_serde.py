"""Writing and reading torch.export programs (the CPU backend's `export` format), without two costs of torch's
serializer that change nothing in the file or the loaded program."""

from __future__ import annotations

import contextlib
import functools
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import torch


def save_program(program: torch.export.ExportedProgram, path: Path) -> None:
    # The program would otherwise save its example inputs: a full copy of the weights per graph.
    program._example_inputs = None
    with _without_canonical_form_check():
        torch.export.save(program, str(path))


def load_program(path: Path) -> torch.fx.GraphModule:
    _memoize_schema_type_hints()
    return torch.export.load(str(path)).module()


@contextlib.contextmanager
def _without_canonical_form_check() -> Iterator[None]:
    """torch's ExportedProgramSerializer.serialize calls `canonicalize` on the program it serializes as a self-test
    and drops the result (torch/_export/serde/serialize.py, "Test canonical form is well defined"): a deep copy and
    sort of the whole program, 40% of a save. The saved bytes do not depend on it
    (tests/core/test_program_files.py)."""
    from torch._export.serde import serialize

    checked = getattr(serialize, "canonicalize", None)
    if checked is None:
        yield
        return
    serialize.canonicalize = lambda program, constants=None: program
    try:
        yield
    finally:
        serialize.canonicalize = checked


@functools.cache
def _memoize_schema_type_hints() -> None:
    """torch.export.load computes typing.get_type_hints of a schema class again for every node it reads: half of
    the time a program takes to load. A class's hints never change, so the deserializer's module gets a `typing`
    whose get_type_hints computes each once (a tiny model's 19 programs: 3.0 s of CPU instead of 6.0 s)."""
    from torch._export.serde import serialize

    if getattr(serialize, "typing", None) is not typing:
        return  # another torch: its deserializer is left as it is
    known: dict[tuple, dict] = {}

    def get_type_hints(obj, globalns=None, localns=None, include_extras=False):
        key = (obj, id(globalns), id(localns), include_extras)
        if key not in known:
            known[key] = typing.get_type_hints(obj, globalns, localns, include_extras)
        return known[key]

    memoized = types.ModuleType("typing")
    memoized.__dict__.update(typing.__dict__)
    memoized.get_type_hints = get_type_hints
    serialize.typing = memoized
