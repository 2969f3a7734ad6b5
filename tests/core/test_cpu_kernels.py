"""The CPU backend's kernel choice: every fp32 linear of every loaded program reads one shared packed weight."""

from __future__ import annotations

import torch


def _packed_linears(program: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in program.graph.nodes if n.op == "call_function" and n.target.__name__ == "_packed_linear"]


def test_every_linear_reads_a_weight_packed_once_for_all_programs(llama_logits):
    programs = llama_logits.model.graphs.programs
    assert len(programs) > 1
    packed_by_name: dict[str, set[int]] = {}
    for program in programs.values():
        linears = program.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
        assert linears == [], f"{len(linears)} linears left on MKL's unpacked path"
        packed = _packed_linears(program)
        # 2 layers x (q, k, v, o, gate, up, down) + the lm_head
        assert len(packed) == 2 * 7 + 1
        for node in packed:
            weight = getattr(program, node.args[1].target)
            assert weight.is_mkldnn
            packed_by_name.setdefault(node.args[1].target, set()).add(id(weight))
    assert all(len(ids) == 1 for ids in packed_by_name.values()), "a weight was packed more than once"
