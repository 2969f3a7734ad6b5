"""The CPU programs' linear layers on weights prepacked once for oneDNN.

A kernel choice of the CPU backend, like one a compiler makes: the graph is unchanged, each fp32
`aten.linear` whose weight is a graph input runs as oneDNN's inner product on a copy of that weight in
oneDNN's blocked layout, packed at load and shared by every program that reads it. Measured on the 2-core
AMD EPYC (SmolLM2 shapes, weights cold in cache): 2 to 4x faster than MKL's `x @ weight.T` for a decode
step's 4 rows (the lm_head: 4.2 ms instead of 16.7), 20-40% faster for a 256-token chunk. The cost is a
second copy of those weights in host memory: the artifact's weights stay as they are. Linears of one input
(q, k, v; gate, up) share one packed product on their stacked weights: fewer oneDNN calls over the same bytes.
An FP8 linear of an fp32 graph (the weight upcast, a linear, its output scaled: models/fp8.py) runs the same way on
its weight upcast once at load (exact), the output scale still applied by the graph: the same math, packed.

A program that computes at most 4 tokens (a decode step) reads each weight once for at most 4 multiply-adds, so its
linears run at the speed the weights stream from memory: they run the C++ kernel `onp_cpu::rows_linear`
(csrc/rows_linear.cpp) on its own packing of each weight, which streams it at 1.4-1.6x oneDNN's rate (SmolLM2's
weights, 2-core AMD EPYC: 34-40 GB/s for 4 rows against 24, 31-33 for 1 row against 22). A weight read by both kinds
of linear is packed twice.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import torch

from ..torch_compat import linear_on_onednn_packed, onednn_pack_linear_weight, script_function
from . import cpu_kernels

ROWS_KERNEL_MAX = 4  # the largest input row count onp_cpu::rows_linear takes (csrc/rows_linear.cpp)


@functools.cache
def packable() -> bool:
    """Whether this torch build packs and runs fp32 linears on oneDNN: checked once on a small product (a build
    without oneDNN, or whose oneDNN refuses the layout, keeps the exported linears)."""
    if not torch.backends.mkldnn.is_available():
        return False
    x, weight = torch.randn(4, 64), torch.randn(32, 64)
    try:
        out = _packed_linear(x, onednn_pack_linear_weight(weight), None)
    except (RuntimeError, AttributeError, OSError):  # OSError: torch.jit.script without the sources
        return False
    return torch.allclose(out, torch.nn.functional.linear(x, weight), rtol=1e-4, atol=1e-4)


def use_packed_linears(
    module: torch.fx.GraphModule, params: dict[str, torch.Tensor], packed: dict, tokens: int
) -> None:
    """Rewrites `module`'s fp32 linears to read packed copies of their weights. Linears of one input (a layer's q, k
    and v projections; its gate and up) run as one product on their weights stacked, its output split back: one
    oneDNN call reading the same bytes instead of several.

    `params` is the dict the program takes first: its leaves are the module's first placeholders, in order.
    `packed` (name -> packed weight) is shared by the programs of one load, so each weight is packed once. `tokens`:
    the tokens the program computes (GraphSpec.computed_tokens), the most rows any of its linears takes; up to
    ROWS_KERNEL_MAX, onp_cpu::rows_linear runs them."""
    placeholders = list(module.graph.find_nodes(op="placeholder"))
    names = dict(zip(placeholders, params, strict=False))
    by_input: dict[torch.fx.Node, list[tuple[torch.fx.Node, str, str | None]]] = {}
    groups = []
    for node in module.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default):
        name = names.get(_upcast_source(node.args[1]) or node.args[1])
        if name is None or _packed_dtype(params[name], node.args[1]) != torch.float32 or params[name].dim() != 2:
            continue
        bias = node.args[2] if len(node.args) > 2 else None
        if bias is not None and names.get(bias) is None:
            groups.append([(node, name, None)])  # a computed bias cannot be stacked: packed alone, read as it is
            continue
        by_input.setdefault(node.args[0], []).append((node, name, names.get(bias)))
    for linears in by_input.values():
        stackable = len(linears) > 1 and len({bias is None for _, _, bias in linears}) == 1  # all biased, or none
        groups += [linears] if stackable else [[linear] for linear in linears]
    for group in groups:
        _pack_group(module, params, packed, group, tokens <= ROWS_KERNEL_MAX)
    module.recompile()


def _pack_group(module: torch.fx.GraphModule, params: dict, packed: dict, group: list, few_rows: bool) -> None:
    """One packed product for the linears in `group` (same input; all with a bias or none), its output split."""
    first = group[0][0]  # the earliest: the group is in graph order
    names = "+".join(name for _, name, _ in group)
    key = ("rows:" if few_rows else "") + names  # a weight both kernels read has both packings
    if key not in packed:
        weights = [params[name].float() for _, name, _ in group]  # an FP8 weight upcast once, exactly
        weight = (torch.cat(weights) if len(group) > 1 else weights[0]).contiguous()
        packed[key] = _rows_weight(weight) if few_rows else onednn_pack_linear_weight(weight)
    with module.graph.inserting_before(first):
        weight = _buffer(module, "packed_" + key, packed[key])
        bias = first.args[2] if len(first.args) > 2 else None
        if bias is not None and len(group) > 1:
            if "bias:" + names not in packed:  # one stacked bias for both kernels
                packed["bias:" + names] = torch.cat([params[b] for _, _, b in group]).contiguous()
            bias = _buffer(module, "bias_" + names, packed["bias:" + names])
        if few_rows:
            outputs = sum(params[name].shape[0] for _, name, _ in group)
            product = module.graph.call_function(_rows_linear(), (first.args[0], weight, bias, outputs))
        else:
            product = module.graph.call_function(_packed_linear, (first.args[0], weight, bias))
    upcasts = [node.args[1] for node, _, _ in group if _upcast_source(node.args[1]) is not None]
    if len(group) == 1:
        first.replace_all_uses_with(product)
        module.graph.erase_node(first)
        _erase_unused(module, upcasts)
        return
    sizes = [params[name].shape[0] for _, name, _ in group]
    with module.graph.inserting_after(product):
        parts = module.graph.call_function(torch.ops.aten.split_with_sizes.default, (product, sizes, -1))
    for i, (node, _, _) in enumerate(group):
        with module.graph.inserting_after(parts):
            part = module.graph.call_function(operator.getitem, (parts, i))
        node.replace_all_uses_with(part)
        module.graph.erase_node(node)
    _erase_unused(module, upcasts)


def _rows_linear():
    cpu_kernels.load()
    return torch.ops.onp_cpu.rows_linear.default


def _rows_weight(weight: torch.Tensor) -> torch.Tensor:
    cpu_kernels.load()
    return torch.ops.onp_cpu.pack_rows_weight(weight)


def _upcast_source(node: object) -> torch.fx.Node | None:
    """The input of `node` when it is an upcast to fp32 (`weight.to(torch.float32)`, an FP8 linear's weight)."""
    if isinstance(node, torch.fx.Node) and node.target is torch.ops.aten.to.dtype and node.args[1] == torch.float32:
        return node.args[0]
    return None


def _packed_dtype(param: torch.Tensor, weight: torch.fx.Node) -> torch.dtype:
    """The dtype the linear computes its weight in: an upcast FP8 weight's is fp32."""
    return torch.float32 if _upcast_source(weight) is not None and param.dtype == torch.float8_e4m3fn else param.dtype


def _erase_unused(module: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> None:
    for node in dict.fromkeys(nodes):
        if not node.users:
            module.graph.erase_node(node)


def _buffer(module: torch.fx.GraphModule, name: str, tensor: torch.Tensor) -> torch.fx.Node:
    attr = name.replace(".", "_").replace("+", "__").replace(":", "_")
    module.register_buffer(attr, tensor, persistent=False)
    return module.graph.get_attr(attr)


def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _scripted_linear()(x, weight, bias)


@functools.cache
def _scripted_linear() -> Callable:
    """oneDNN's op takes a `Scalar?[]` argument that torch.jit.trace cannot record (cpu_script.py traces the
    programs); compiled by torch.jit.script, the linear is recorded as one call of this function."""
    return script_function(linear_on_onednn_packed)
