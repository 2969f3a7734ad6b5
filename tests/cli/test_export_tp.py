"""`optimum-cli export neuron --tensor-parallel-size 2 --backend cpu`: a sharded artifact, served by 2 ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from support.exports import load_hf, neuron_config, prompt_ids
from support.references import hf_greedy, runtime_greedy
from support.tensor_parallel import run_ranks

from optimum_neuron_plugin import NeuronModelForCausalLM

from .helpers import export_in_process, run_export
from .test_export import TINY_ARGS, assert_refused

TP = 2
NEW_TOKENS = 12
COLLECTIVES = ("_c10d_functional.all_reduce", "_c10d_functional.all_gather_into_tensor")


@pytest.fixture(scope="module")
def tp_export(tiny_models, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("llama-tp") / "exported"
    result = run_export(
        "--model", tiny_models["llama"], *TINY_ARGS, "--prefill-chunk-size", "16", "--context-buckets", "32,64",
        "--prefill-buckets", "0,64", "--tensor-parallel-size", TP, output,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return output


def test_the_artifact_stores_full_weights_once_and_sharded_graphs(tp_export, tiny_models):
    assert neuron_config(tp_export)["tp_degree"] == TP
    hf = load_hf(tiny_models["llama"])
    with safe_open(tp_export / "model.safetensors", "pt") as weights:
        stored = set(weights.keys())
        assert "model.layers.0.self_attn.q_proj.weight" in stored
        for name, tensor in hf.state_dict().items():
            if name in stored:
                assert tuple(weights.get_slice(name).get_shape()) == tuple(tensor.shape), name
    graphs = sorted((tp_export / "graphs").glob("*.pt2"))
    # chunked_prefill, token_generation of 1 and 2 rows, chunk_and_decode x 2 buckets: one program for every rank
    assert len(graphs) == 8
    for path in graphs:
        program = torch.export.load(str(path))
        code = program.graph_module.code
        assert all(op in code for op in COLLECTIVES), path.name
        shapes = {
            tuple(node.meta["val"].shape)
            for node in program.graph_module.graph.find_nodes(op="placeholder")
            if node.name.endswith("q_proj_weight")
        }
        hidden = hf.config.hidden_size
        assert shapes == {(hidden // TP, hidden)}, path.name  # the rank's shard: half of the query heads


def greedy_worker(rank: int, artifact: Path, prompt: list[int], out: Path) -> None:
    tokens = runtime_greedy(NeuronModelForCausalLM.from_pretrained(artifact), prompt, NEW_TOKENS)
    torch.save(tokens, out / f"rank{rank}.pt")


def test_two_ranks_generate_hf_greedy_tokens(tp_export, tiny_models, tmp_path):
    prompt = prompt_ids(tiny_models["llama"])
    run_ranks(greedy_worker, TP, tp_export, prompt, tmp_path, start_method="fork")
    expected = hf_greedy(load_hf(tiny_models["llama"]), prompt, NEW_TOKENS)
    assert [torch.load(tmp_path / f"rank{r}.pt") for r in range(TP)] == [expected] * TP


def test_loading_without_a_process_group_is_refused(tp_export):
    with pytest.raises(ValueError, match=r"tp_degree=2: load it in each of 2 processes"):
        NeuronModelForCausalLM.from_pretrained(tp_export)


def test_tensor_parallel_needs_exported_programs(tiny_llama, tmp_path):
    output = tmp_path / "out"
    result = export_in_process(
        "--model", tiny_llama, *TINY_ARGS, "--tensor-parallel-size", TP, "--cpu-compiler", "inductor", output
    )
    assert_refused(result, output, "tp_degree=2 needs --cpu-compiler export")
