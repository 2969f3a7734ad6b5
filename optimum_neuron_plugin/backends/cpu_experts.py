"""The CPU programs' gathered-expert products on views of the selected experts instead of a gathered copy.

A kernel choice of the CPU backend, like the packed linears (cpu_linear.py): the graph is unchanged. A MoE
decode step gathers its tokens' experts by the router's indices and multiplies by them (models/moe.py,
`gathered_experts`): `bmm(x, index_select(weight, 0, index).transpose(1, 2))`. Run as written on the host,
the gather copies every selected expert into a fresh tensor: megabytes per projection, which glibc maps and
returns to the kernel on every call, so each copy also page-faults its pages in again. Measured on the 2-core
AMD EPYC (random Qwen3-MoE, hidden 1024, 16 experts, top 2): ~6700 page faults and 3x the time of a dense
model of the same active weights per 1-row decode step. Here each row is multiplied by a view of its expert
in the stacked weight: the same reads of the selected experts, no copy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..torch_compat import script_function

aten = torch.ops.aten


def use_expert_views(module: torch.fx.GraphModule) -> int:
    """Rewrites `module`'s products by gathered experts to read views of the stacked weight; returns how many."""
    rewritten = 0
    for node in module.graph.find_nodes(op="call_function", target=aten.bmm.default):
        weight, index = _gathered_weight(node.args[1])
        if weight is None:
            continue
        node.target, node.args = _experts_matmul, (node.args[0], weight, index)
        rewritten += 1
    if rewritten:
        module.graph.eliminate_dead_code()
        module.recompile()
    return rewritten


def _gathered_weight(node: torch.fx.Node) -> tuple[torch.fx.Node | None, torch.fx.Node | None]:
    """(weight, index) when `node` is `index_select(weight, 0, index).transpose(1, 2)` of a graph input weight
    that nothing else reads gathered; else (None, None)."""
    if not _is_call(node, aten.transpose.int) or sorted(d % 3 for d in node.args[1:]) != [1, 2]:
        return None, None
    gathered = node.args[0]
    if not _is_call(gathered, aten.index_select.default) or len(gathered.users) != 1 or gathered.args[1] != 0:
        return None, None
    weight, index = gathered.args[0], gathered.args[2]
    if weight.op != "placeholder":
        return None, None
    return weight, index


def _is_call(node: object, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target == target


def _experts_matmul(x: torch.Tensor, weight: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return _scripted_experts_matmul()(x, weight, index)


def _matmul_by_views(x: torch.Tensor, weight: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [N, M, in], weight [E, out, in], index [N] -> [N, M, out]: row i times expert index[i] (a view)."""
    experts: list[int] = index.tolist()
    rows: list[torch.Tensor] = []
    for i, expert in enumerate(experts):
        rows.append(torch.nn.functional.linear(x[i], weight[expert]))
    return torch.stack(rows)


@functools.cache
def _scripted_experts_matmul() -> Callable:
    """Compiled by torch.jit.script so that the replay's trace (cpu_script.py) records the loop over the rows,
    not the experts of the traced call."""
    return script_function(_matmul_by_views)
