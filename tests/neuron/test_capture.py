"""Every graph kind of every architecture, in each bucket where the model code branches, is captured whole by TorchDynamo, through the call the
neuron backend makes (NeuronGraphs: torch.compile(fullgraph=True, dynamic=False)), with a compiler that only
records what it is given. fullgraph=True turns any graph break into an error."""

from __future__ import annotations

import re

import pytest
import torch
from support.tiny_models import quick_first

from optimum_neuron_plugin.backends.neuron import NeuronBackend, NeuronGraphs
from optimum_neuron_plugin.config import NeuronConfig
from optimum_neuron_plugin.graph_inputs import INDEX_DTYPE
from optimum_neuron_plugin.graphs import (
    CONTEXT_ENCODING,
    COPY_PREFIX,
    PROMPT_LOGITS,
    VERIFY,
    example_inputs,
    graph_specs,
)
from optimum_neuron_plugin.torch_compat import register_compile_backend, unregister_compile_backend

from .conftest import ARCHITECTURES, MOE_ARCHITECTURES

RECORDER = "onp_record_graphs"
# Chunked prefill (prior buckets 0, 8, 16, 24, 32, 48, 64; context buckets 8, 16, 32, 64) with on-device sampling;
# and one context_encoding graph.
# One-row decode graphs too (not a neuron default): every code path is captured.
CONFIGS = {
    "chunked": dict(
        batch_size=2, sequence_length=64, prefill_chunk_size=8, decode_batch_sizes=(1, 2), prefix_copy=True
    ),
    "context_encoding": dict(batch_size=2, sequence_length=32, prefill_chunk_size=0, decode_batch_sizes=(1, 2)),
}


@pytest.fixture(scope="module")
def recorded():
    graphs: list[torch.fx.GraphModule] = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    register_compile_backend(record, RECORDER)
    # One Dynamo cache entry per distinct graph, and this module captures 4 models x 2 shapes: more than one
    # process serves (NeuronGraphs allows one entry per graph of its model).
    with torch.compiler.config.patch(recompile_limit=128):
        yield graphs
    unregister_compile_backend(RECORDER)
    torch.compiler.reset()


@pytest.mark.parametrize("shape", list(CONFIGS))
@pytest.mark.parametrize("name", quick_first(ARCHITECTURES))
def test_every_graph_is_one_dynamo_graph(tiny_models, recorded, name, shape):
    config = NeuronConfig(backend="neuron", torch_dtype="bfloat16", **CONFIGS[shape])
    model = tiny_models[name]
    backend = NeuronBackend(config, compiler=RECORDER, device="cpu")
    graphs = NeuronGraphs(backend, model.graphs(config), model.params(config), model.caches(config))
    specs = graph_specs(config, model.args.vocab_size)
    # per decode bucket token_generation of 1 and 2 rows; per context bucket chunk_and_decode and copy_prefix if
    # chunked (else context_encoding); chunked_prefill per prefill bucket
    per_bucket = 2 if config.chunked else 1
    expected = 2 * len(config.decode_buckets) + per_bucket * len(config.context_buckets) + len(config.prefill_buckets)
    assert len(specs) == expected
    # copy_prefix depends on the cache's shape only: Dynamo would reuse another model's capture of the same shape.
    torch.compiler.reset()
    picked = every_code_path(specs)
    if not config.chunked:
        # Its token_generation graphs trace the code of the chunked shape's (the smallest bucket, and the largest,
        # which is the whole cache): the one graph kind of its own is context_encoding.
        picked = [s for s in picked if s.name == CONTEXT_ENCODING]
        assert len(picked) == 1
    check_captured(graphs, picked, recorded, name)


def every_code_path(specs: list) -> list:
    """Per graph kind and row count, the buckets where the model code branches: the smallest and the largest (a
    sliding-window layer reads its window only in buckets above it; a row per cache row attends the cache in place)
    and, for prompt chunks, the smallest prior context that is not empty. Buckets in between trace the same code
    with other sizes."""
    picked = []
    for kind in dict.fromkeys((s.name, s.rows, s.tokens) for s in specs):
        same = sorted((s for s in specs if (s.name, s.rows, s.tokens) == kind), key=lambda s: s.bucket)
        nonzero = [s for s in same if s.bucket]
        picked += list(dict.fromkeys([same[0], *nonzero[:1], same[-1]]))
    return picked


@pytest.mark.parametrize("name", quick_first(ARCHITECTURES))
def test_verify_graphs_are_one_dynamo_graph(tiny_models, recorded, name):
    """Verify graphs (speculative decoding: 1 and 2 rows x 4 tokens per context bucket) of the chunked shape."""
    config = NeuronConfig(backend="neuron", torch_dtype="bfloat16", speculative_tokens=3, **CONFIGS["chunked"])
    model = tiny_models[name]
    backend = NeuronBackend(config, compiler=RECORDER, device="cpu")
    graphs = NeuronGraphs(backend, model.graphs(config), model.params(config), model.caches(config))
    specs = [spec for spec in graph_specs(config, model.args.vocab_size) if spec.name == VERIFY]
    assert [(s.rows, s.tokens) for s in specs] == [(1, 4), (2, 4)] * len(config.context_buckets)
    # The narrow graph of the smallest bucket and the slot-order graph of the largest (the two attention paths).
    check_captured(graphs, [specs[0], specs[-1]], recorded, name)


@pytest.mark.parametrize("name", quick_first(ARCHITECTURES))
def test_tail_graphs_are_one_dynamo_graph(tiny_models, recorded, name):
    """The tail graphs (prefill_tail_size 4 of chunk 8): chunked_prefill per prefill bucket and chunk_and_decode per
    context bucket with a 4-token chunk; the ones of a middle bucket are captured whole."""
    config = NeuronConfig(backend="neuron", torch_dtype="bfloat16", prefill_tail_size=4, **CONFIGS["chunked"])
    model = tiny_models[name]
    backend = NeuronBackend(config, compiler=RECORDER, device="cpu")
    graphs = NeuronGraphs(backend, model.graphs(config), model.params(config), model.caches(config))
    tails = [s for s in graph_specs(config, model.args.vocab_size) if s.tail]
    assert len(tails) == len(config.prefill_buckets) + len(config.context_buckets)
    assert {s.prompt_tokens for s in tails} == {4}
    check_captured(graphs, [s for s in tails if s.bucket == 16], recorded, name)


def test_copy_prefix_graphs_copy_the_device_cache_in_place(tiny_models, recorded):
    """copy_prefix per context bucket (captured whole: test_every_graph_is_one_dynamo_graph): its call writes the
    destination's blocks of the cache tensors the device holds (an input mutation), those covering positions
    [0, bucket) from the source's, and nothing else."""
    config = NeuronConfig(backend="neuron", torch_dtype="bfloat16", **CONFIGS["chunked"])
    model = tiny_models["llama"]
    backend = NeuronBackend(config, compiler=RECORDER, device="cpu")
    graphs = NeuronGraphs(backend, model.graphs(config), model.params(config), model.caches(config))
    specs = [s for s in graph_specs(config, model.args.vocab_size) if s.name == COPY_PREFIX]
    assert [s.bucket for s in specs] == list(config.context_buckets)
    for cache in graphs.caches:
        cache.copy_(torch.randn(cache.shape))
    before = [cache.clone() for cache in graphs.caches]
    width = config.blocks_per_sequence
    source = torch.arange(1, width + 1, dtype=INDEX_DTYPE)  # two sequences' blocks, the second's in reverse order
    destination = torch.arange(2 * width, width, -1, dtype=INDEX_DTYPE)
    spec = specs[0]  # a bucket below sequence_length: the blocks past it stay
    bucket, block_size = spec.bucket, config.block_size
    copied = bucket // block_size
    assert 0 < copied < width
    graphs(spec, source, destination)
    kept = [b for b in range(config.num_blocks) if b not in destination[:copied].tolist()]
    for cache, old in zip(graphs.caches, before, strict=True):
        assert torch.equal(cache[destination[:copied].long()], old[source[:copied].long()])
        assert torch.equal(cache[kept], old[kept])


def check_captured(graphs, specs, recorded, name: str) -> None:
    for spec in specs:
        before = len(recorded)
        inputs = example_inputs(spec)
        assert all(x.dtype == INDEX_DTYPE for x in inputs[:3])
        graphs(spec, *inputs)
        graphs(spec, *inputs)  # the second call reuses the captured graph
        assert len(recorded) == before + 1, f"{name} {spec.key}: {len(recorded) - before} graphs"
        code = recorded[-1].code
        assert "cumsum" not in code, f"{name} {spec.key} computes a cumsum"
        assert "index_copy_" in code, f"{name} {spec.key} does not write the KV cache in place"
        if spec.samples:  # logit_bias pairs (int32 ids) applied to the raw top-k's candidates, then a top-k of those
            assert spec.logit_bias == 32 and code.count("torch.topk(") == 2, f"{name} {spec.key} applies no logit_bias"
        assert int64_values(code) <= {"write_slots", "write_blocks", "heads"}, f"{name} {spec.key} builds int64 values"


@pytest.mark.parametrize("name", quick_first(ARCHITECTURES))
def test_prompt_logits_graph_is_one_dynamo_graph(tiny_models, recorded, name):
    """The prompt_logits graph (exports with prompt_logprobs) of a middle prior bucket: one graph, every position's
    logits out, no int64 beyond the allowed."""
    config = NeuronConfig(backend="neuron", torch_dtype="bfloat16", prompt_logprobs=True, **CONFIGS["chunked"])
    model = tiny_models[name]
    backend = NeuronBackend(config, compiler=RECORDER, device="cpu")
    graphs = NeuronGraphs(backend, model.graphs(config), model.params(config), model.caches(config))
    specs = graph_specs(config, model.args.vocab_size)
    assert [s.bucket for s in specs if s.name == PROMPT_LOGITS] == list(config.prefill_buckets)
    spec = next(s for s in specs if s.name == PROMPT_LOGITS and s.bucket == 16)
    before = len(recorded)
    logits = graphs(spec, *example_inputs(spec))
    assert len(recorded) == before + 1, f"{name} {spec.key}: {len(recorded) - before} graphs"
    assert logits.shape == (config.prefill_chunk_size, model.args.vocab_size)
    code = recorded[-1].code
    assert "index_copy_" in code and "cumsum" not in code
    assert int64_values(code) <= {"write_slots", "write_blocks", "heads"}, f"{name} {spec.key} builds int64 values"


@pytest.mark.parametrize("name", quick_first(MOE_ARCHITECTURES, quick=("qwen3_moe",)))
def test_moe_graphs_are_one_dynamo_graph(tiny_models, recorded, name):
    """A decode step (experts gathered by the router's indices), a prefill chunk (every expert, densely weighted) and
    chunk_and_decode of each MoE family: one graph each, no int64 beyond the allowed."""
    config = NeuronConfig(backend="neuron", torch_dtype="bfloat16", **CONFIGS["chunked"])
    model = tiny_models[name]
    backend = NeuronBackend(config, compiler=RECORDER, device="cpu")
    graphs = NeuronGraphs(backend, model.graphs(config), model.params(config), model.caches(config))
    specs = graph_specs(config, model.args.vocab_size)
    picked = {
        spec.name: spec
        for spec in specs
        if spec.name in ("token_generation", "chunked_prefill")
        and spec.bucket == 16
        and spec.rows == 1
        or spec.name == "chunk_and_decode"
    }
    assert set(picked) == {"token_generation", "chunked_prefill", "chunk_and_decode"}
    for spec in picked.values():
        before = len(recorded)
        graphs(spec, *example_inputs(spec))
        assert len(recorded) == before + 1, f"{name} {spec.key}: {len(recorded) - before} graphs"
        code = recorded[-1].code
        assert "topk" in code, f"{name} {spec.key} routes no token"
        assert int64_values(code) <= {"write_slots", "write_blocks", "heads"}, f"{name} {spec.key} builds int64 values"


def int64_values(code: str) -> set[str]:
    """The values a captured graph widens to int64 or builds as int64 (arange without a dtype), by name stem: int64 is
    emulated on NeuronCores and TorchNeuron has no pass narrowing it. Only the KV scatters' indices (write slots and
    heads, copy_prefix's write blocks) are allowed: index_copy_ takes int64 indices only. topk's indices are int64 by
    definition and not counted."""
    made = re.findall(r"(\w+) = \w+\.long\(\)", code) + re.findall(r"(\w+) = torch\.arange\((?:(?!dtype)[^)])*\)", code)
    return {re.sub(r"_\d+$", "", name) for name in made}


def test_lora_graphs_are_one_dynamo_graph(tiny_models, recorded):
    """With LoRA slots every graph kind (a row group's slots gathered per call, then two bmm per projection) is
    still captured whole, with no int64 index."""
    from optimum_neuron_plugin.runtime.artifact_io import lora_slots

    config = NeuronConfig(
        backend="neuron", torch_dtype="bfloat16", speculative_tokens=3, max_loras=2, max_lora_rank=4,
        **CONFIGS["chunked"],
    )  # fmt: skip
    model = tiny_models["llama"]
    backend = NeuronBackend(config, compiler=RECORDER, device="cpu")
    params = model.params(config) | lora_slots(model.args, config)
    graphs = NeuronGraphs(backend, model.graphs(config), params, model.caches(config))
    specs = graph_specs(config, model.args.vocab_size)
    picked = list({s.name: s for s in specs if s.name != COPY_PREFIX}.values())
    assert {s.name for s in picked} == {"chunked_prefill", "token_generation", "chunk_and_decode", VERIFY}
    torch.compiler.reset()
    check_captured(graphs, picked, recorded, "llama-lora")
    assert all("bmm" in graph.code for graph in recorded[-len(picked) :])
