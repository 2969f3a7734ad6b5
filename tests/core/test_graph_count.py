"""The default graph set per backend and shape: a product promise (docs/neuron.md, "Graphs").

The neuron backend compiles at most 9 graphs for a chunked export (neuronx-cc takes minutes per graph of an 8B
model) and keeps every graph kind vLLM serves with: chunked prefill, on-device sampling, the fused chunk+decode."""

from __future__ import annotations

from collections import Counter

import pytest

from optimum_neuron_plugin.config import NeuronConfig
from optimum_neuron_plugin.graphs import graph_specs

LLAMA_VOCAB = 128256
# (batch, sequence, chunk, tp) -> the default graph count on the neuron backend, then on the cpu backend.
SHAPES = {
    "8B b8 s8192 c1024": ((8, 8192, 1024, 1), 9, 19),
    "8B b32 s4096 c512": ((32, 4096, 512, 1), 9, 19),
    "70B tp32 b16 s8192 c1024": ((16, 8192, 1024, 32), 9, 19),
}


def _specs(shape: tuple[int, int, int, int], backend: str, **options):
    batch, sequence, chunk, tp = shape
    config = NeuronConfig(
        batch_size=batch, sequence_length=sequence, prefill_chunk_size=chunk, tp_degree=tp, backend=backend,
        torch_dtype="bfloat16", **options,
    )  # fmt: skip
    return graph_specs(config, LLAMA_VOCAB)


@pytest.mark.parametrize("name", SHAPES)
def test_default_graph_count_per_backend(name):
    shape, neuron_count, cpu_count = SHAPES[name]
    assert len(_specs(shape, "neuron")) == neuron_count
    assert len(_specs(shape, "cpu")) == cpu_count


def test_neuron_defaults_keep_every_graph_kind():
    specs = _specs((8, 8192, 1024, 1), "neuron")
    kinds = Counter(spec.name for spec in specs)
    assert kinds == {"chunked_prefill": 4, "token_generation": 3, "chunk_and_decode": 2}
    assert sorted(s.bucket for s in specs if s.name == "chunked_prefill") == [0, 2048, 4096, 8192]
    assert sorted(s.bucket for s in specs if s.name == "token_generation") == [2048, 4096, 8192]
    assert all(s.samples and s.rows == 8 for s in specs if s.name in ("token_generation", "chunk_and_decode"))


def test_neuron_extra_graphs_are_options():
    """Each richer choice is one option away, at the cost the docs state (one graph per bucket or row count)."""
    shape = (8, 8192, 1024, 1)
    assert len(_specs(shape, "neuron", decode_batch_sizes=(1, 8))) == 9 + 3  # one-row decode graphs
    # 4 context buckets: decode follows them (4), chunk_and_decode 4, prefill 4
    assert len(_specs(shape, "neuron", context_buckets=(1024, 2048, 4096, 8192))) == 12
    assert len(_specs(shape, "neuron", prefill_buckets=(0, 1024, 2048, 3072, 4096, 6144, 8192))) == 9 + 3
    assert len(_specs(shape, "neuron", prefix_copy=True)) == 9 + 2  # the Python API's copy_prefix, per context bucket


def test_unchunked_neuron_default():
    specs = _specs((4, 2048, 0, 1), "neuron")
    assert Counter(spec.name for spec in specs) == {"context_encoding": 2, "token_generation": 3}
