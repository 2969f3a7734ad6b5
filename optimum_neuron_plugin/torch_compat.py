"""Every private torch name the package uses, each behind a function named for what it does.

A torch release can rename or drop any of these without notice: they live here, and nowhere else, so a version bump
is checked in one file (tests/core/test_torch_compat.py exercises each entry). TorchScript's entry points are public
but deprecated (torch warns on every script and trace): they are here too, for the same reason. Importing this module
checks the installed torch against the range these entries were written for.

Imports torch and the standard library only: models/ and backends/ both import it.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional_collectives
import torch.fx
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx._pytree import tree_flatten_spec
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
from torch.utils import _pytree as pytree

# [first, last): the releases these entries were checked on (2.13: the CPU wheel; 2.14: the TorchNeuron DLAMI's).
SUPPORTED_TORCH = ((2, 13), (2, 15))


class UnsupportedTorchError(RuntimeError):
    """The installed torch is outside the range the package's compat entries were written for."""


def check_torch_version(installed: str | None = None) -> str:
    """The installed torch's version; raises when it is outside SUPPORTED_TORCH, naming both."""
    version = installed or torch.__version__
    match = re.match(r"(\d+)\.(\d+)", version)
    first, last = SUPPORTED_TORCH
    if match is None or not first <= (int(match[1]), int(match[2])) < last:
        raise UnsupportedTorchError(
            f"optimum-neuron-plugin supports torch >= {_release(first)}, < {_release(last)}; torch {version} is "
            "installed: use the torch scripts/setup.sh installs (CPU hosts) or the TorchNeuron DLAMI's"
        )
    return version


def _release(release: tuple[int, int]) -> str:
    return ".".join(map(str, release))


check_torch_version()


# ---- graph modules rebuilt from a record (backends/cpu_graph_record.py) -----------------------------------------


def lazy_graph_module(constants: dict[str, torch.Tensor], graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A GraphModule whose Python code is generated at its first call, not when built (torch's _LazyGraphModule,
    which inductor uses for the same reason)."""
    return _LazyGraphModule(constants, graph)


def pytree_signature(graph: torch.fx.Graph) -> tuple[list[str], Any, Any] | None:
    """(argument names, input tree, output tree) of a graph whose code takes and returns trees of tensors (the code
    of a torch.export module); None for a graph with another code generator."""
    codegen = graph._codegen
    if not isinstance(codegen, _PyTreeCodeGen):
        return None
    info = codegen.pytree_info
    return list(info.orig_args), info.in_spec, info.out_spec


def use_pytree_signature(graph: torch.fx.Graph, orig_args: list[str], in_spec: Any, out_spec: Any) -> None:
    """Makes `graph`'s code take and return trees of tensors, as pytree_signature describes them."""
    graph.set_codegen(_PyTreeCodeGen(_PyTreeInfo(orig_args, in_spec, out_spec)))


def module_tree_specs(module: torch.fx.GraphModule) -> tuple[Any, Any]:
    """(input tree, output tree) of a torch.export module: the trees its inputs are checked against."""
    return module._in_spec, module._out_spec


def set_module_tree_specs(module: torch.fx.GraphModule, in_spec: Any, out_spec: Any) -> None:
    module._in_spec, module._out_spec = in_spec, out_spec


def flatten_by_spec(value: Any, spec: Any) -> list:
    """The leaves of `value` in the order of the tree `spec` (as a torch.export module flattens its inputs)."""
    return tree_flatten_spec(value, spec)


def treespec_to_text(spec: Any) -> str:
    return pytree.treespec_dumps(spec)


def treespec_from_text(text: str) -> Any:
    return pytree.treespec_loads(text)


def op_overload_name(target: Any) -> str | None:
    """`namespace::op.overload` for an op overload (a node target like torch.ops.aten.add.Tensor); None for
    anything else."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    return f"{target._schema.name}.{target._overloadname}"


# ---- torch.export program files (backends/cpu_serde.py) --------------------------------------------------------


@contextlib.contextmanager
def export_save_without_canonical_check() -> Iterator[None]:
    """torch.export.save without its serializer's self-test: ExportedProgramSerializer.serialize canonicalizes the
    program and drops the result (torch/_export/serde/serialize.py, "Test canonical form is well defined"), a deep
    copy and sort of the whole program that changes nothing it writes."""
    from torch._export.serde import serialize

    checked = serialize.canonicalize
    serialize.canonicalize = lambda program, constants=None: program
    try:
        yield
    finally:
        serialize.canonicalize = checked


@contextlib.contextmanager
def export_load_reading_json_with(reader: Callable[[Any, Any], Any]) -> Iterator[None]:
    """torch.export.load converting the program's JSON to schema dataclasses with `reader(cls, data)` instead of
    torch's `_dict_to_dataclass`, for the duration of the block."""
    from torch._export.serde import serialize

    torch_reader = serialize._dict_to_dataclass
    serialize._dict_to_dataclass = reader
    try:
        yield
    finally:
        serialize._dict_to_dataclass = torch_reader


def export_json_reader() -> Callable[[Any, Any], Any]:
    """torch's converter of a program's JSON to schema dataclasses (what export_load_reading_json_with replaces)."""
    from torch._export.serde import serialize

    return serialize._dict_to_dataclass


def export_schema() -> Any:
    """The module of torch.export's file schema dataclasses (the names its type hints resolve in)."""
    from torch._export.serde import schema

    return schema


def resolve_export_schema_type(cls: Any) -> Any:
    """A schema type hint as torch's reader resolves it (a forward reference by name becomes its class)."""
    from torch._export.serde import serialize

    return serialize._resolve_schema_cls(cls)


def is_export_schema_union(cls: Any) -> bool:
    """Whether `cls` is one of the schema's tagged unions (written as a one-key dict, built by cls.create)."""
    from torch._export.serde.union import _Union

    return isinstance(cls, type) and issubclass(cls, _Union)


# ---- AOTInductor packages (backends/cpu.py) ---------------------------------------------------------------------


def aoti_compile_package(program: torch.export.ExportedProgram, path: Path, configs: dict[str, Any]) -> None:
    """Compiles `program` to a C++ package at `path` with inductor options `configs` (torch documents AOTInductor
    under torch._inductor; it has no other home)."""
    import torch._inductor

    torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)


def aoti_load_package(path: Path) -> Callable:
    import torch._inductor

    return torch._inductor.aoti_load_package(str(path))


# ---- oneDNN linears on prepacked weights (backends/cpu_linear.py) ----------------------------------------------


def onednn_pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """An fp32 [out, in] weight in oneDNN's blocked layout, for linear_on_onednn_packed."""
    return torch.ops.mkldnn._reorder_linear_weight(weight)


def linear_on_onednn_packed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T (+ bias) by oneDNN's inner product on a weight packed by onednn_pack_linear_weight.
    TorchScript-compatible (script_function compiles it)."""
    scalars: list[int | float | complex | None] = []
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", scalars, "")


# ---- C++ extension builds (backends/cpu_kernels.py) -------------------------------------------------------------


def cpp_extension_build_lock(directory: Path) -> Path:
    """The lock file torch.utils.cpp_extension.load holds in its build directory while it builds (a FileBaton: a
    build killed midway leaves it behind)."""
    return Path(directory) / "lock"


# ---- TorchScript (backends/cpu_script.py, cpu_linear.py, cpu_experts.py) -----------------------------------------


def script_function(function: Callable) -> Callable:
    """`function` compiled by torch.jit.script (it needs the function's source)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated")
        return torch.jit.script(function)


def trace_module(module: torch.nn.Module, args: tuple) -> Callable:
    """module(*args) run once under torch.jit.trace: the record of every op it ran, replayed by calling it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.trace")  # deprecated for torch.compile
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)  # constants of the graph
        return torch.jit.trace(module, args, check_trace=False, strict=False)


def unoptimized_replay() -> contextlib.AbstractContextManager:
    """Traces replayed without profiling runs or re-optimisation: the first replays cost what the others do."""
    return torch.jit.optimized_execution(False)


# ---- Dynamo backends (tests) -------------------------------------------------------------------------------------


def register_compile_backend(compiler: Callable, name: str) -> None:
    """Makes `compiler` a torch.compile backend named `name`."""
    torch._dynamo.register_backend(compiler, name=name)


def unregister_compile_backend(name: str) -> None:
    """Drops the torch.compile backend `name` (torch has no public way to)."""
    from torch._dynamo.backends import registry

    registry._COMPILER_FNS.pop(name, None)
    registry._BACKENDS.pop(name, None)


# ---- collectives (models/collectives.py) -------------------------------------------------------------------------


def functional_all_reduce_sum(x: torch.Tensor, group: str) -> torch.Tensor:
    """Sum of `x` over the ranks of the process group named `group`, as an op with a result (torch.export records
    it with the group's name)."""
    return functional_collectives.all_reduce(x, "sum", group)


def functional_all_gather(x: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """`x` of every rank of the group named `group`, concatenated along `dim` in rank order."""
    return functional_collectives.all_gather_tensor(x, dim, group)


def group_collective_ops() -> tuple:
    """The ops functional_all_reduce_sum and functional_all_gather record: the group's name is their last argument."""
    return (
        torch.ops._c10d_functional.all_reduce.default,
        torch.ops._c10d_functional.all_gather_into_tensor.default,
    )


def init_fake_process_group(world_size: int) -> None:
    """The default process group: `world_size` ranks of which this process is rank 0, and no communication
    (collectives return without exchanging data). torch registers its "fake" backend when its module loads."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
