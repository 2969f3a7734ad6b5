"""Each graph kind's inputs are one dataclass (graph_inputs.py): what tracing builds (example values) and what the
graph reads back are the same tensors in the same order; every compiled graph takes the positional inputs of its
format (shapes and dtypes), those the runtime passes."""

from __future__ import annotations

import torch

from optimum_neuron_plugin import NeuronConfig
from optimum_neuron_plugin.graph_inputs import INDEX_DTYPE, flat
from optimum_neuron_plugin.graphs import graph_specs, inputs_class

EVERY_KIND = NeuronConfig(
    batch_size=4, sequence_length=64, prefill_chunk_size=8, prefill_batch_size=2, prefill_tail_size=4,
    speculative_tokens=2, prompt_logprobs=True, decode_batch_sizes=(1, 2, 4), max_topk=8, max_logprobs=2,
    max_logit_bias=3,
)  # fmt: skip
VOCAB = 100


def test_the_graph_reads_back_what_tracing_passes():
    for config in (EVERY_KIND, NeuronConfig(batch_size=2, sequence_length=32, on_device_sampling=False)):
        for spec in graph_specs(config, VOCAB):
            tensors = flat(inputs_class(spec).example(spec))
            # one tensor passed as two inputs would be traced as one: the graph would read it for both
            assert len({id(x) for x in tensors}) == len(tensors), spec.key
            read = flat(inputs_class(spec).unflat(spec, iter(tensors)))
            assert len(read) == len(tensors) and all(a is b for a, b in zip(read, tensors, strict=True)), spec.key


def test_every_graph_takes_the_inputs_of_its_format():
    """The positional inputs of format 8 (neuron_config.json), per kind: rows of (ids, positions) [n, T] and block
    tables [n, S / block_size] int32 (a chunk first in chunk_and_decode), then on-device sampling's params [n, 4],
    uniform [n, 1], bitmask [n, ceil(V / 32)] int32 and logit_bias ids [n, M] int32 and values [n, M]; copy_prefix
    two block tables [S / block_size]."""
    words, bias = 4, EVERY_KIND.max_logit_bias
    blocks = 64 // 4  # sequence_length / the default block_size (the tail of 4 tokens divides it)
    assert EVERY_KIND.block_size == 4

    def rows(n: int, tokens: int) -> list:
        return [((n, tokens), INDEX_DTYPE), ((n, tokens), INDEX_DTYPE), ((n, blocks), INDEX_DTYPE)]

    def sampling(n: int) -> list:
        fp32 = torch.float32
        return [((n, 4), fp32), ((n, 1), fp32), ((n, words), torch.int32), ((n, bias), INDEX_DTYPE), ((n, bias), fp32)]

    for spec in graph_specs(EVERY_KIND, VOCAB):
        n = spec.rows
        expected = {
            "chunked_prefill": rows(n, spec.prompt_tokens),
            "prompt_logits": rows(1, 8),
            "verify": rows(n, 3),
            "token_generation": rows(n, 1) + sampling(n),
            "chunk_and_decode": rows(1, spec.chunk) + rows(n, 1) + sampling(n),
            "copy_prefix": [((blocks,), INDEX_DTYPE), ((blocks,), INDEX_DTYPE)],
        }[spec.name]
        got = [(tuple(x.shape), x.dtype) for x in flat(inputs_class(spec).example(spec))]
        assert got == expected, spec.key
