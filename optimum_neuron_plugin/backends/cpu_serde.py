"""Writing and reading torch.export programs (the CPU backend's `export` format): each archive also holds the record
its module is rebuilt from at load (cpu_graph_record.py); without one, torch.export.load runs without two costs of
torch's serializer that change nothing in the file or the loaded program."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import types
import typing
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.export.pt2_archive.constants import EXTRA_DIR

# The programs' custom ops and their CPU kernels, registered before a program loads.
from . import cpu_attention, cpu_pointwise  # noqa: F401
from .cpu_graph_record import RECORD_FILE, rebuild, record


def save_program(program: torch.export.ExportedProgram, path: Path) -> None:
    # The program would otherwise save its example inputs: a full copy of the weights per graph.
    program._example_inputs = None
    text = record(program.module())
    with _without_canonical_form_check():
        torch.export.save(program, str(path), extra_files={RECORD_FILE: text} if text else None)


def load_program(path: Path) -> torch.fx.GraphModule:
    text = _record_text(path)
    module = rebuild(text) if text is not None else None
    if module is not None:
        return module
    _use_planned_dict_to_dataclass()
    return torch.export.load(str(path)).module()


def _record_text(path: Path) -> str | None:
    """The graph record in the program's archive; None when it has none (or is no archive: torch.export.load
    then says why)."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith(f"/{EXTRA_DIR}{RECORD_FILE}")), None)
            return archive.read(name).decode() if name else None
    except (OSError, zipfile.BadZipFile):
        return None


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
def _use_planned_dict_to_dataclass() -> None:
    """torch.export.load turns the program's JSON into schema dataclasses with `_dict_to_dataclass`, which works out
    each value's type again for every node it reads (type hints, origins, unions, dataclass fields): most of the time
    a program takes to load. `_planned` does the same conversion from a plan worked out once per type, and returns
    equal objects (tests/core/test_program_files.py)."""
    from torch._export.serde import serialize

    global torch_dict_to_dataclass
    if getattr(serialize, "_dict_to_dataclass", None) is None or getattr(serialize, "schema", None) is None:
        return  # another torch: its deserializer is left as it is
    torch_dict_to_dataclass = serialize._dict_to_dataclass
    serialize._dict_to_dataclass = planned_dict_to_dataclass


torch_dict_to_dataclass: Callable | None = None  # the reader load_program replaced


def planned_dict_to_dataclass(cls: Any, data: Any) -> Any:
    return _plan(cls)(data)


@functools.cache
def _plan(cls: Any) -> Callable[[Any], Any]:
    """The converter of JSON data to `cls`, branch for branch what torch's `_dict_to_dataclass` does."""
    from torch._export.serde import schema, serialize
    from torch._export.serde.union import _Union

    cls = serialize._resolve_schema_cls(cls)
    if isinstance(cls, str):
        raise AssertionError(f"Unresolved class type: '{cls}'.")
    origin = typing.get_origin(cls)
    if origin is typing.Annotated:
        return _plan(cls.__origin__)
    if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
        args = typing.get_args(cls)
        if len(args) != 2:
            raise AssertionError(f"expected 2 type args, got {len(args)}")
        return functools.partial(_optional, args[0])
    if isinstance(cls, type) and issubclass(cls, _Union):
        return functools.partial(_union, cls, typing.get_type_hints(cls, globalns=vars(schema)))
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls, globalns=vars(schema))
        return functools.partial(_dataclass, cls, tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls)))
    return functools.partial(_value, cls, typing.get_args(cls))


def _optional(inner: Any, data: Any) -> Any:
    return None if data is None else _plan(inner)(data)


def _union(cls: Any, hints: dict, data: Any) -> Any:
    if not isinstance(data, dict):
        raise AssertionError(f"expected dict, got {type(data).__name__}")
    if len(data) != 1:
        raise AssertionError(f"expected dict with 1 key, got {len(data)}")
    ((kind, value),) = data.items()
    if not isinstance(kind, str):
        raise AssertionError(f"expected str key, got {type(kind).__name__}")
    return cls.create(**{kind: _plan(hints[kind])(value)})


def _dataclass(cls: Any, fields: tuple, data: dict) -> Any:
    # Keys the dataclass does not define are ignored, as torch does (forward compatibility).
    return cls(**{name: _plan(hint)(data[name]) for name, hint in fields if name in data})


def _value(cls: Any, args: tuple, data: Any) -> Any:
    if isinstance(data, list):
        if not data:
            return data
        convert = _plan(args[0])
        return [convert(item) for item in data]
    if isinstance(data, dict):
        convert = _plan(args[1])
        return {key: convert(value) for key, value in data.items()}
    if cls is float:
        return float(data)
    return data
