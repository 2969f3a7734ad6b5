"""Writing and reading torch.export programs (the CPU backend's `export` format): each archive also holds the record
its module is rebuilt from at load (cpu_graph_record.py); without one, torch.export.load reads it. Saving and loading
skip two costs of torch's serializer that change nothing in the file or the loaded program."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.export.pt2_archive.constants import EXTRA_DIR

from .. import torch_compat

# The programs' custom ops and their CPU kernels, registered before a program loads.
from . import cpu_attention, cpu_pointwise  # noqa: F401
from .cpu_graph_record import RECORD_FILE, rebuild, record


def save_program(program: torch.export.ExportedProgram, path: Path) -> None:
    # The program would otherwise save its example inputs: a full copy of the weights per graph.
    program.example_inputs = None
    text = record(program.module())
    # torch's serializer canonicalizes the program as a self-test and drops the result: 40% of a save, the saved
    # bytes do not depend on it (tests/core/test_program_files.py).
    with torch_compat.export_save_without_canonical_check():
        torch.export.save(program, str(path), extra_files={RECORD_FILE: text} if text else None)


def load_program(path: Path) -> torch.fx.GraphModule:
    text = _record_text(path)
    module = rebuild(text) if text is not None else None
    if module is not None:
        return module
    # torch's reader works out each JSON value's type again for every node it reads (type hints, origins, unions,
    # dataclass fields): most of the time a program takes to load. The planned reader returns equal objects.
    with torch_compat.export_load_reading_json_with(planned_dict_to_dataclass):
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


def planned_dict_to_dataclass(cls: Any, data: Any) -> Any:
    """torch's conversion of a program's JSON `data` to the schema type `cls`, from a plan worked out once per type."""
    return _plan(cls)(data)


@functools.cache
def _plan(cls: Any) -> Callable[[Any], Any]:
    """The converter of JSON data to `cls`, branch for branch what torch's `_dict_to_dataclass` does."""
    cls = torch_compat.resolve_export_schema_type(cls)
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
    schema = vars(torch_compat.export_schema())
    if torch_compat.is_export_schema_union(cls):
        return functools.partial(_union, cls, typing.get_type_hints(cls, globalns=schema))
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls, globalns=schema)
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
