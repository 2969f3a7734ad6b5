"""Where a prefix hit's time goes: the graph calls of benchmark/prefix_cache.sh's workload (SmolLM2, S 2048, batch 4)
run eagerly (DecoderGraph without export: the same ops), median of 5 alternated rounds after one warm-up, 2 threads.

    .venv/bin/python benchmark/graph_cases/chunk_widths.py [--model M] [--out DIR]

- chunked_prefill of one prompt with a 128 / 64 / 32-token chunk at start 1000 (prior bucket 1024): a hit's question;
- chunk_and_decode of such a chunk and 4 decode rows at position 1100, in context bucket 1536 and 2048;
- token_generation of 4 rows near the end of context buckets 1024, 1536 and 2048.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import add_out, default_model

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
        inputs[2] = torch.tensor([[3]], dtype=torch.int32)  # block tables: one 2048-position block per row
        inputs[4] = torch.full((spec.rows, 1), decode_position, dtype=torch.int32)
        inputs[5] = torch.arange(spec.rows, dtype=torch.int32)[:, None]
    elif spec.name == CHUNKED_PREFILL:
        inputs[1] = torch.arange(start, start + spec.tokens, dtype=torch.int32)[None]
    else:
        inputs[1] = torch.full((spec.rows, 1), decode_position, dtype=torch.int32)
        inputs[2] = torch.arange(spec.rows, dtype=torch.int32)[:, None]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a .gguf or HF directory (default: SmolLM2)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up")
    add_out(parser, "chunk-width-and-bucket-eager-calls")
    args = parser.parse_args()
    model = str(args.model or default_model())
    torch.set_num_threads(2)
    _, model_args = read_config(model)
    params = to_params(load_source(model).state_dict, model_args, torch.float32)
    caches = empty_cache(
        model_args.num_hidden_layers, 4, 2048, model_args.num_key_value_heads, model_args.head_dim, torch.float32
    )
    torch.manual_seed(0)
    for cache in caches:
        cache.normal_()
    graphs = {
        name: (DecoderGraph(model_args, spec, 256), inputs_for(spec, start, position))
        for name, (spec, start, position) in cases(model_args.vocab_size).items()
    }
    times: dict[str, list[float]] = {name: [] for name in graphs}
    with torch.inference_mode():
        for round_ in range(args.rounds + 1):
            for name, (graph, inputs) in graphs.items():
                began = time.perf_counter()
                graph(params, caches, *inputs)
                if round_:
                    times[name].append(time.perf_counter() - began)
    lines = [f"Eager graph calls, {Path(model).name}, median of {args.rounds} alternated rounds, 2 threads", ""]
    lines += ["| call | ms |", "|---|---:|"]
    lines += [f"| {name} | {statistics.median(seconds) * 1000:.1f} |" for name, seconds in times.items()]
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calls.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
