"""A compact record of a CPU program's graph, saved in its .pt2 archive beside the exported program, from which
the serving process rebuilds the module it runs in a fraction of `torch.export.load`'s time.

`torch.export.load` rebuilds the whole ExportedProgram: it parses the program's JSON into schema dataclasses, makes
a fake tensor for every node's metadata and unlifts the program into a module, ~2 s per SmolLM2 graph (minutes for
an artifact of 70 graphs). The module the backend runs needs none of that: its nodes (op, target, arguments), its
few constant tensors, its input and output trees and the shapes of its inputs. The record holds exactly these, and
is written only when the module rebuilt from it prints the same code as the program's own module
(`torch.export.ExportedProgram.module()`): the same graph, node for node (its inputs' values on the meta device, the
other nodes without metadata). A program without a record (another writer, an op the record cannot name) is loaded
by torch.export as before.
"""

from __future__ import annotations

import base64
import io
import json
import operator
from typing import Any

import torch
import torch.fx

from .. import torch_compat

RECORD_FILE = "onp_graph.json"
RECORD_VERSION = 1
_FUNCTIONS = {"getitem": operator.getitem}
_SCALARS = (bool, int, float, str, type(None))


class Unrecordable(Exception):
    """A node argument or target the record has no form for."""


def record(module: torch.fx.GraphModule) -> str | None:
    """The record of `module` (a program's unlifted module), or None when one of its nodes cannot be recorded or
    the module rebuilt from the record would differ."""
    try:
        text = json.dumps(_record(module), separators=(",", ":"))
        rebuilt = rebuild(text)
    except Exception:  # noqa: BLE001 - whatever the record misses, the program is still saved and loads without one
        return None
    return text if rebuilt is not None and rebuilt.code == module.code else None


def rebuild(text: str) -> torch.fx.GraphModule | None:
    """The module a record describes; None for a record of another torch or record version."""
    data = json.loads(text)
    if data.get("version") != RECORD_VERSION or data.get("torch") != torch.__version__:
        return None
    graph = torch.fx.Graph()
    nodes: dict[str, torch.fx.Node] = {}
    inputs = iter(data["inputs"])
    for op, name, target, args, kwargs in data["nodes"]:
        node = graph.create_node(
            op, _target(op, target), _decode(args, nodes), _decode(kwargs, nodes), name=name, type_expr=None
        )
        if op == "placeholder":  # its value's shape and dtype, as torch's module has them (on no device)
            shape, dtype = next(inputs)
            node.meta["val"] = torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
        nodes[name] = node
    info = data["pytree"]
    torch_compat.use_pytree_signature(graph, info["orig_args"], _spec(info["in_spec"]), _spec(info["out_spec"]))
    constants = {name: _tensor(blob) for name, blob in data["constants"].items()}
    # Lazy: its Python code is generated at its first call, once, after the backend's rewrites (packed linears).
    module = torch_compat.lazy_graph_module(constants, graph)
    torch_compat.set_module_tree_specs(module, _spec(data["in_spec"]), _spec(data["out_spec"]))
    module.validate_inputs = True
    module.register_forward_pre_hook(_check_inputs)
    return module


def _check_inputs(module: torch.fx.GraphModule, args: tuple) -> None:
    if module.validate_inputs:
        check_inputs(module, args)


def check_inputs(module: torch.fx.GraphModule, args: tuple) -> None:
    """The check torch.export's module makes on its inputs: every tensor of the shape and dtype it was exported
    with (a graph file of another export fails here, on its first call)."""
    in_spec, _ = torch_compat.module_tree_specs(module)
    flat = torch_compat.flatten_by_spec((list(args), {}), in_spec)
    expected = [node.meta["val"] for node in module.graph.find_nodes(op="placeholder")]
    for index, (tensor, value) in enumerate(zip(flat, expected, strict=True)):
        if tensor.shape != value.shape or tensor.dtype != value.dtype:
            raise ValueError(
                f"input {index} of the graph is {tuple(tensor.shape)} {tensor.dtype}, it was exported for "
                f"{tuple(value.shape)} {value.dtype}"
            )


def _record(module: torch.fx.GraphModule) -> dict:
    signature = torch_compat.pytree_signature(module.graph)
    if signature is None:
        raise Unrecordable("codegen")
    inputs = []
    nodes = []
    for node in module.graph.nodes:
        if node.op == "placeholder":
            inputs.append(_input_shape(node))
        nodes.append([node.op, node.name, _target_name(node), _encode(node.args), _encode(node.kwargs)])
    constants = {
        node.target: _tensor_blob(getattr(module, node.target)) for node in module.graph.find_nodes(op="get_attr")
    }
    orig_args, in_spec, out_spec = signature
    module_in_spec, module_out_spec = torch_compat.module_tree_specs(module)
    return {
        "version": RECORD_VERSION,
        "torch": torch.__version__,
        "pytree": {
            "orig_args": orig_args,
            "in_spec": _spec_text(in_spec),
            "out_spec": _spec_text(out_spec),
        },
        "in_spec": _spec_text(module_in_spec),
        "out_spec": _spec_text(module_out_spec),
        "inputs": inputs,
        "constants": constants,
        "nodes": nodes,
    }


def _input_shape(node: torch.fx.Node) -> list:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or not all(isinstance(d, int) for d in value.shape):
        raise Unrecordable(f"placeholder {node.name}")
    return [list(value.shape), str(value.dtype).removeprefix("torch.")]


def _target_name(node: torch.fx.Node) -> str:
    if node.op in ("placeholder", "output", "get_attr"):
        return node.target
    if node.op != "call_function":
        raise Unrecordable(node.op)
    target = node.target
    name = torch_compat.op_overload_name(target)
    if name is not None:
        return name
    name = next((name for name, function in _FUNCTIONS.items() if function is target), None)
    if name is None:
        raise Unrecordable(str(target))
    return name


def _target(op: str, name: str) -> Any:
    if op != "call_function":
        return name
    if name in _FUNCTIONS:
        return _FUNCTIONS[name]
    qualified, overload = name.rsplit(".", 1)
    namespace, op_name = qualified.split("::")
    return getattr(getattr(getattr(torch.ops, namespace), op_name), overload)


def _encode(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(item) for item in value]}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {"dict": {key: _encode(item) for key, item in value.items()}}
    for kind in (torch.dtype, torch.layout, torch.memory_format):
        if isinstance(value, kind):
            return {kind.__name__: str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    raise Unrecordable(type(value).__name__)


def _decode(value: Any, nodes: dict[str, torch.fx.Node]) -> Any:
    if isinstance(value, list):
        return [_decode(item, nodes) for item in value]
    if not isinstance(value, dict):
        return value
    ((kind, inner),) = value.items()
    if kind == "node":
        return nodes[inner]
    if kind == "tuple":
        return tuple(_decode(item, nodes) for item in inner)
    if kind == "dict":
        return {key: _decode(item, nodes) for key, item in inner.items()}
    if kind == "device":
        return torch.device(inner)
    return getattr(torch, inner)  # a dtype, layout or memory format


def _spec_text(spec: Any) -> str | None:
    return None if spec is None else torch_compat.treespec_to_text(spec)


def _spec(text: str | None) -> Any:
    return None if text is None else torch_compat.treespec_from_text(text)


def _tensor_blob(tensor: Any) -> str:
    if not isinstance(tensor, torch.Tensor):
        raise Unrecordable(type(tensor).__name__)
    buffer = io.BytesIO()
    torch.save(tensor.detach().clone(), buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def _tensor(blob: str) -> torch.Tensor:
    return torch.load(io.BytesIO(base64.b64decode(blob)), weights_only=True)
