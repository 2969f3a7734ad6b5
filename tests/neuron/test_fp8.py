"""FP8 graphs as the neuron backend hands them to TorchNeuron (torch.compile(fullgraph=True), a recording compiler):
each is one Dynamo graph taking the FP8 weights and the FP8 cache as inputs, upcasting the weights to bf16 before a
plain matmul and scaling the output, with no torch._scaled_mm (TorchNeuron lowers no FP8 matmul op: docs/fp8.md);
every FP8 weight is within trn2's +-240."""

from __future__ import annotations

import re

import pytest
import torch

from optimum_neuron_plugin import artifact
from optimum_neuron_plugin.backends.neuron import NeuronBackend, NeuronGraphs
from optimum_neuron_plugin.config import NeuronConfig
from optimum_neuron_plugin.graphs import example_inputs, graph_specs
from optimum_neuron_plugin.models.kv_cache import empty_cache
from optimum_neuron_plugin.runtime import fp8_params
from optimum_neuron_plugin.runtime.artifact_io import to_params
from optimum_neuron_plugin.torch_compat import register_compile_backend, unregister_compile_backend

RECORDER = "onp_record_fp8_graphs"


@pytest.fixture(scope="module")
def recorded():
    graphs: list[torch.fx.GraphModule] = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    register_compile_backend(record, RECORDER)
    with torch.compiler.config.patch(recompile_limit=64):
        yield graphs
    unregister_compile_backend(RECORDER)
    torch.compiler.reset()


def test_fp8_graphs_are_one_dynamo_graph_with_upcast_weights(tiny_models, recorded):
    config = NeuronConfig(
        backend="neuron", torch_dtype="bfloat16", target="trn2", quantization="fp8", kv_cache_dtype="fp8",
        batch_size=2, sequence_length=32, prefill_chunk_size=8, context_buckets=(16, 32), prefill_buckets=(0, 16, 32),
        prefix_copy=True,
    )  # fmt: skip
    model = tiny_models["llama"]
    params = to_params(model.state_dict, model.args, torch.bfloat16, config)
    params |= fp8_params.calibrated_kv_scales(model.args, to_params(model.state_dict, model.args, torch.bfloat16), None)
    fp8_weights = [t for t in params.values() if t.dtype == torch.float8_e4m3fn]
    assert len(fp8_weights) == 7 * model.args.num_hidden_layers
    assert all(t.float().abs().max() <= 240 for t in fp8_weights)  # trn2's E4M3
    a = model.args
    caches = empty_cache(
        a.num_hidden_layers, config.num_blocks, config.block_size, a.num_key_value_heads, a.head_dim,
        artifact.cache_dtype(config),
    )  # fmt: skip
    backend = NeuronBackend(config, compiler=RECORDER, device="cpu")
    graphs = NeuronGraphs(backend, model.graphs(config), params, caches)
    specs = graph_specs(config, a.vocab_size)
    picked = [s for s in specs if s.bucket == 16 and s.rows in (1, 2)]
    assert {s.name for s in picked} >= {"token_generation", "chunked_prefill", "chunk_and_decode", "copy_prefix"}
    torch.compiler.reset()
    for spec in picked:
        before = len(recorded)
        graphs(spec, *example_inputs(spec))
        assert len(recorded) == before + 1, f"{spec.key}: {len(recorded) - before} graphs"
        code = recorded[-1].code
        assert "_scaled_mm" not in code, spec.key
        if spec.name != "copy_prefix":
            # per projection: the FP8 weight upcast to bf16, a plain linear, the output times its per-channel scale
            upcasts = re.findall(r"= l_params_\w+_proj_weight_\.to\(torch\.bfloat16\)", code)
            assert len(upcasts) == 7 * a.num_hidden_layers, spec.key
            assert code.count("torch._C._nn.linear(") == 7 * a.num_hidden_layers + 1, spec.key  # and lm_head
            assert code.count(".to(torch.float8_e4m3fn)") >= 2 * a.num_hidden_layers, spec.key  # K and V stored
        assert "index_put_" in code or "index_copy_" in code, f"{spec.key} does not write the KV cache in place"
    assert all(cache.dtype == torch.float8_e4m3fn for cache in graphs.caches)
