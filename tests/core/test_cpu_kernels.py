"""The CPU backend's kernel choice: every fp32 linear of every loaded program reads one shared packed weight."""

from __future__ import annotations

import torch
from support.references import hf_greedy, runtime_greedy

from optimum_neuron_plugin import NeuronModelForCausalLM
from optimum_neuron_plugin.backends import cpu_linear

from . import helpers


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


def test_a_torch_without_onednn_keeps_the_exported_linears_and_hf_tokens(llama_logits, monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    cpu_linear.packable.cache_clear()
    try:
        model = NeuronModelForCausalLM.from_pretrained(llama_logits.path)
    finally:
        cpu_linear.packable.cache_clear()
    for program in model.graphs.programs.values():
        assert _packed_linears(program) == []
        assert program.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    prompt = helpers.prompt(13, seed=5)
    assert runtime_greedy(model, prompt, 6) == hf_greedy(llama_logits.hf, prompt, 6)
