"""The mixture-of-experts block (models/moe.py) against Hugging Face's, for Qwen3-MoE, Mixtral and gpt-oss:
both ways of running the experts (gathered by the router's indices, as a decode step does; every expert densely
weighted, as a prefill chunk does) on the routings that matter: k = 2, k = 1, k = every expert, ties between
experts' logits, every token picking the same expert. Then the tiny MoE models end to end: greedy tokens equal HF's
(teacher-forced logits across chunks and buckets: tests/core/test_families.py)."""

from __future__ import annotations

import pytest
import torch
from support.references import hf_greedy, runtime_greedy
from support.tiny_models import quick_first, tiny_model

from optimum_neuron_plugin.backends import cpu_experts
from optimum_neuron_plugin.graphs import CHUNKED_PREFILL, TOKEN_GENERATION
from optimum_neuron_plugin.models import moe
from optimum_neuron_plugin.models.args import ModelArgs
from optimum_neuron_plugin.models.checkpoint import decoder_weights

from .helpers import CHUNKED_LOGITS_LIGHT, SEEDS, prompt

FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss")
STRATEGIES = {"gathered": True, "dense": False}  # moe.moe's `gather`
TOKENS = 6
PREFIX = "model.layers.0.mlp."


def block_case(name: str, **overrides) -> tuple[ModelArgs, dict, torch.nn.Module]:
    """ModelArgs, our weights and HF's MoE block of layer 0 of a tiny model."""
    hf = tiny_model(name, seed=SEEDS[name], vocab_size=64, **overrides)
    args = ModelArgs.from_hf_config({**hf.config.to_dict(), "architectures": [type(hf).__name__]})
    return args, decoder_weights(hf.state_dict(), args), hf.model.layers[0].mlp


def run_block(args, params, strategy: str, x: torch.Tensor) -> torch.Tensor:
    return moe.moe(args, params, PREFIX, x, gather=STRATEGIES[strategy])


def hf_block(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = block(x[None])
    return (out[0] if isinstance(out, tuple) else out)[0]  # gpt-oss returns (hidden, router scores)


def router(block: torch.nn.Module) -> torch.nn.Module:
    return block.gate if hasattr(block, "gate") else block.router  # gpt-oss: `router`, with a bias


def sync_router(block: torch.nn.Module, params: dict) -> None:
    """Our router weights := HF's (after a test changed them)."""
    params[PREFIX + "gate.weight"] = router(block).weight.detach().clone()
    if getattr(router(block), "bias", None) is not None:
        params[PREFIX + "gate.bias"] = router(block).bias.detach().clone()


def hidden(seed: int, positive: bool = False) -> torch.Tensor:
    x = torch.randn(TOKENS, 64, generator=torch.Generator().manual_seed(seed))
    return x.abs() if positive else x


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("k", [1, 2, 8])
@pytest.mark.parametrize("name", FAMILIES)
def test_block_equals_hf_for_k_experts_per_token(name, k, strategy):
    args, params, block = block_case(name, num_experts_per_tok=k)
    x = hidden(1)
    torch.testing.assert_close(run_block(args, params, strategy, x), hf_block(block, x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", FAMILIES)
def test_tied_router_logits_pick_hf_experts(name, strategy):
    """Experts 0 and 1 have the same router row, so their logits tie for every token; scaled up, they are the top
    two and with k = 1 the tie decides which expert runs (their weights differ): the pick must be HF's."""
    args, params, block = block_case(name, num_experts_per_tok=1)
    gate = router(block)
    with torch.no_grad():
        gate.weight[0] = gate.weight[1] = 3.0 * gate.weight[1]
        if getattr(gate, "bias", None) is not None:
            gate.bias[0] = gate.bias[1]
    sync_router(block, params)
    x = hidden(2)
    _, index = moe.route(args, params, PREFIX, x)
    assert set(index[:, 0].tolist()) & {0, 1}, "no token's logits tie"
    assert not torch.equal(params[PREFIX + "experts.gate_proj"][0], params[PREFIX + "experts.gate_proj"][1])
    torch.testing.assert_close(run_block(args, params, strategy, x), hf_block(block, x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", FAMILIES)
def test_every_token_picking_one_expert(name, strategy):
    """A chunk whose tokens all route to expert 3 first (positive inputs, a large positive router row)."""
    args, params, block = block_case(name)
    with torch.no_grad():
        router(block).weight[3] = 1.0
    sync_router(block, params)
    x = hidden(3, positive=True)
    _, index = moe.route(args, params, PREFIX, x)
    assert index[:, 0].tolist() == [3] * TOKENS
    torch.testing.assert_close(run_block(args, params, strategy, x), hf_block(block, x), atol=1e-5, rtol=0)


def test_a_decode_step_gathers_and_a_chunk_runs_every_expert():
    """Few tokens read only their experts' weights; once T * k reaches E, every expert is read once instead."""
    args = ModelArgs.from_hf_config(tiny_model("qwen3_moe", vocab_size=64).config.to_dict())
    assert (args.num_experts, args.num_experts_per_tok) == (8, 2)
    assert moe.gathers_experts(3, args) and not moe.gathers_experts(4, args) and not moe.gathers_experts(8, args)


def test_qwen3_moe_dense_layers_are_read():
    config = tiny_model("qwen3_moe", vocab_size=64, mlp_only_layers=[1]).config.to_dict()
    args = ModelArgs.from_hf_config(config)
    assert args.moe_layers == (True, False) and (args.intermediate_size, args.moe_intermediate_size) == (128, 32)


@pytest.mark.parametrize("name", quick_first(FAMILIES, quick=("qwen3_moe",)))
def test_greedy_tokens_equal_hf(zoo, name):
    artifact = zoo.artifact(name, **CHUNKED_LOGITS_LIGHT)
    tokens = prompt(13, seed=71)  # two chunks (dense experts), then decode steps (gathered experts)
    assert runtime_greedy(artifact.model, tokens, 12) == hf_greedy(artifact.hf, tokens, 12)


def _expert_products(program: torch.fx.GraphModule) -> tuple[int, int]:
    """(products on views of the stacked experts, gathers that copy experts' weights) in a CPU program."""
    calls = [n for n in program.graph.nodes if n.op == "call_function"]
    views = sum(n.target is cpu_experts._experts_matmul for n in calls)
    # A loaded program's nodes other than its inputs carry no metadata (cpu_graph_record.py): the expert weights are
    # found by name.
    copies = sum(n.target == torch.ops.aten.index_select.default and "experts" in n.args[0].name for n in calls)
    return views, copies


def test_cpu_decode_programs_read_views_of_the_selected_experts(zoo):
    """The CPU backend runs a gathering graph's products on views of the picked experts, not on a gathered copy
    (backends/cpu_experts.py); a chunk's graph runs every expert and has no gather. Greedy tokens through these
    programs: test_greedy_tokens_equal_hf."""
    model = zoo.artifact("qwen3_moe", **CHUNKED_LOGITS_LIGHT).model
    products = {spec: _expert_products(program) for spec, program in model.graphs.programs.items()}
    decode = [spec for spec in products if spec.name == TOKEN_GENERATION]
    assert decode and all(products[spec] == (2 * 3, 0) for spec in decode)  # 2 MoE layers x gate, up, down
    chunks = [spec for spec in products if spec.name == CHUNKED_PREFILL]
    assert chunks and all(products[spec] == (0, 0) for spec in chunks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expert_views_product_equals_the_gathered_product(dtype):
    """Rows picking the same expert twice, several rows per expert product, bf16."""
    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(8, 24, 16, generator=generator).to(dtype)
    x = torch.randn(5, 3, 16, generator=generator).to(dtype)
    index = torch.tensor([6, 1, 6, 0, 7])
    want = torch.bmm(x, weight.index_select(0, index).transpose(1, 2))
    torch.testing.assert_close(cpu_experts._experts_matmul(x, weight, index), want)
