"""Where a prefix hit's time goes: the graph calls of benchmark/prefix_cache.sh's workload (SmolLM2, S 2048, batch 4)
run eagerly (DecoderGraph without export: the same ops), median of 5 alternated rounds after one warm-up, 2 threads.

    .venv/bin/python benchmark/chunk_widths.py HF_MODEL_DIR

- chunked_prefill of one prompt with a 128 / 64 / 32-token chunk at start 1000 (prior bucket 1024): a hit's question;
- chunk_and_decode of such a chunk and 4 decode rows at position 1100, in context bucket 1536 and 2048;
- token_generation of 4 rows near the end of context buckets 1024, 1536 and 2048.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from optimum_neuron_plugin.graphs import (
    CHUNK_AND_DECODE,
    CHUNKED_PREFILL,
    TOKEN_GENERATION,
    DecoderGraph,
    GraphSpec,
    example_inputs,
)
from optimum_neuron_plugin.models.kv_cache import empty_cache
from optimum_neuron_plugin.runtime.artifact_io import to_params
from optimum_neuron_plugin.sources import load_source, read_config


def inputs_for(spec: GraphSpec, start: int, decode_position: int) -> list[torch.Tensor]:
    inputs = list(example_inputs(spec))
    if spec.chunk:
        inputs[1] = torch.arange(start, start + spec.chunk, dtype=torch.int32)[None]
        inputs[2] = torch.tensor([3], dtype=torch.int32)
        inputs[4] = torch.full((spec.rows, 1), decode_position, dtype=torch.int32)
        inputs[5] = torch.arange(spec.rows, dtype=torch.int32)
    elif spec.name == CHUNKED_PREFILL:
        inputs[1] = torch.arange(start, start + spec.tokens, dtype=torch.int32)[None]
    else:
        inputs[1] = torch.full((spec.rows, 1), decode_position, dtype=torch.int32)
        inputs[2] = torch.arange(spec.rows, dtype=torch.int32)
    return inputs


def cases(vocab_size: int) -> dict[str, tuple[GraphSpec, int, int]]:
    sampling = dict(bitmask_words=(vocab_size + 31) // 32, logprobs=20, logit_bias=32)
    found = {}
    for width in (128, 64, 32):
        found[f"chunked_prefill T{width} prior1024"] = (GraphSpec(CHUNKED_PREFILL, 1, width, False, 1024), 1000, 0)
        for bucket in (1536, 2048):
            spec = GraphSpec(CHUNK_AND_DECODE, 4, 1, True, bucket, width, **sampling)
            found[f"chunk_and_decode T{width} L{bucket}"] = (spec, 1000, 1100)
    for bucket in (1024, 1536, 2048):
        spec = GraphSpec(TOKEN_GENERATION, 4, 1, True, bucket, **sampling)
        found[f"token_generation x4 L{bucket}"] = (spec, 0, bucket - 100)
    return found


def main(model: str) -> None:
    torch.set_num_threads(2)
    _, args = read_config(model)
    params = to_params(load_source(model).state_dict, args, torch.float32)
    caches = empty_cache(args.num_hidden_layers, 4, 2048, args.num_key_value_heads, args.head_dim, torch.float32)
    torch.manual_seed(0)
    for cache in caches:
        cache.normal_()
    graphs = {
        name: (DecoderGraph(args, spec, 256), inputs_for(spec, start, position))
        for name, (spec, start, position) in cases(args.vocab_size).items()
    }
    times: dict[str, list[float]] = {name: [] for name in graphs}
    with torch.inference_mode():
        for round_ in range(6):
            for name, (graph, inputs) in graphs.items():
                began = time.perf_counter()
                graph(params, caches, *inputs)
                if round_:
                    times[name].append(time.perf_counter() - began)
    for name, seconds in times.items():
        print(f"{name:40s} {statistics.median(seconds) * 1000:8.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
