"""Graph calls against Hugging Face transformers eager on the same weights: same process, same threads,
timings alternated, ratios printed (below 1.0: the plugin is faster).

    .venv/bin/python benchmark/graph_cases/calls.py [--model M.gguf|HF_DIR] [--compilers inductor,export] [--threads 2] [--context 300]
                                         [--long-context 4000]

For each CPU compiler it exports the model (SmolLM2 by default; cached under benchmark/results/artifacts/), then
measures
- decode: one token_generation call for batch_size rows at --context positions, against one HF decode
  step of the same batch with a KV cache of the same length;
- decode_1: the same for one request (the one-row token_generation graph, decode_batch_sizes), against HF's decode
  step of one sequence;
- decode_1_rows: one request on the one-row graph against the same request padded into the batch_size-row graph
  (plugin against plugin), at --context and near the sequence length (the largest bucket);
- chunk: one chunked_prefill call (the first chunk of a prompt), against HF's forward of the same tokens;
- prompt: a prompt of --chunks chunks through the chunk loop, against HF's forward of the same tokens;
- chunk_and_decode: the second chunk of a prompt and a decode step of the other batch_size - 1 rows (at
  --context) in one chunk_and_decode call, against the two calls it replaces (plugin against plugin, not HF);
- decode_long (with --long-context): the decode step of every row at --long-context positions against the one at
  --context (plugin against plugin): what a longer context costs (sliding-window layers read only their window).
HF computes only the last position's logits (logits_to_keep=1), as the graphs do. Writes
graphs.json into --out (benchmark/graphs.py runs it as the `calls` case).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import ARTIFACTS, add_out, alternate, default_model, export, hf_model, prompt_ids, slug, write_json


def measure(directory: Path, hf, args: argparse.Namespace) -> dict:
    from transformers import DynamicCache

    from optimum_neuron_plugin import NeuronModelForCausalLM

    model = NeuronModelForCausalLM.from_pretrained(directory)
    batch = model.neuron_config.batch_size
    vocab = model.args.vocab_size
    tokens = prompt_ids(max(args.chunk * args.chunks, args.context), vocab)
    context = tokens[: args.context]
    for slot in range(batch):
        model.prefill(slot, context)
    hf_cache = DynamicCache()
    with torch.inference_mode():
        hf(torch.tensor([context] * batch), past_key_values=hf_cache, use_cache=True, logits_to_keep=1)
    hf_cache_1 = DynamicCache()
    with torch.inference_mode():
        hf(torch.tensor([context]), past_key_values=hf_cache_1, use_cache=True, logits_to_keep=1)
    step = {"plugin": args.context, "plugin_1": args.context}

    def plugin_decode():
        model.decode(list(range(batch)), [7] * batch, [step["plugin"]] * batch)
        step["plugin"] += 1

    def plugin_decode_1(rows=None, at="plugin_1"):
        def call():
            model.decode([batch - 1], [7], [step[at]], rows=rows)
            step[at] += 1

        return call

    def hf_decode(cache, rows):
        def call():
            with torch.inference_mode():
                hf(torch.tensor([[7]] * rows), past_key_values=cache, use_cache=True, logits_to_keep=1)

        return call

    def hf_forward(n):
        def call():
            with torch.inference_mode():
                hf(torch.tensor([tokens[:n]]), use_cache=False, logits_to_keep=1)

        return call

    chunk, prompt = args.chunk, args.chunk * args.chunks
    decoding = list(range(batch - 1))  # the last slot prefills its second chunk: a bucket that holds the decode rows
    positions = [args.context] * (batch - 1)

    def fused():
        model.prefill_and_decode(batch - 1, tokens[chunk : 2 * chunk], chunk, decoding, [7] * len(decoding), positions)

    def separate():
        model.decode(decoding, [7] * len(decoding), positions)
        model.prefill(batch - 1, tokens[chunk : 2 * chunk], start=chunk)

    several_rows = batch > 1  # chunk_and_decode and the one-row graph need a batch of rows
    return {
        **decode_long(model, args),
        **(
            {"chunk_and_decode": alternate(fused, separate, args.repeats, ("fused", "separate"))}
            if several_rows
            else {}
        ),
        "decode": alternate(plugin_decode, hf_decode(hf_cache, batch), args.repeats),
        **({"decode_1": alternate(plugin_decode_1(), hf_decode(hf_cache_1, 1), args.repeats)} if several_rows else {}),
        **(decode_rows(model, plugin_decode_1, step, args) if several_rows else {}),
        "chunk": alternate(lambda: model.prefill(0, tokens[:chunk]), hf_forward(chunk), args.repeats),
        f"prompt_{args.chunks}_chunks": alternate(lambda: model.prefill(0, tokens[:prompt]), hf_forward(prompt), 3),
    }


def decode_long(model, args: argparse.Namespace) -> dict:
    """Every row decoding at --long-context against every row at --context (each its own slots' positions)."""
    if not args.long_context:
        return {}
    # A step's cost depends on its bucket and positions, not on what the cache holds: no prefill of a long prompt.
    batch = model.neuron_config.batch_size
    step = {"long": args.long_context, "short": args.context}

    def at(which):
        def call():
            model.decode(list(range(batch)), [7] * batch, [step[which]] * batch)
            step[which] += 1

        return call

    return {"decode_long": alternate(at("long"), at("short"), args.repeats, ("long", "short"))}


def decode_rows(model, plugin_decode_1, step: dict, args: argparse.Namespace) -> dict:
    """One request on the one-row graph against the batch graph, at --context and in the largest bucket."""
    nc = model.neuron_config
    if len(nc.decode_batch_sizes) == 1:
        return {}
    results = {}
    for name, context in (("decode_1_rows", args.context), ("decode_1_rows_long", nc.sequence_length - 64)):
        step["one"] = step["batch"] = context
        one, batch = plugin_decode_1(1, "one"), plugin_decode_1(nc.batch_size, "batch")
        results[name] = alternate(one, batch, args.repeats, ("one_row", "batch_rows"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a .gguf or HF directory (default: SmolLM2)")
    parser.add_argument("--compilers", default="inductor,export")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--sequence-length", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--context-buckets", default=None, help="e.g. 512,2048 (default: the exporter's)")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--long-context", type=int, default=0, help="also time decode at this context (decode_long)")
    parser.add_argument("--block-size", type=int, default=None, help="KV cache block size (default: the exporter's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    add_out(parser, "graph-calls-vs-hf-eager")
    args = parser.parse_args()
    model = args.model or default_model()
    torch.set_num_threads(args.threads)
    hf = hf_model(model)
    results = {"threads": args.threads, "context": args.context, "chunk": args.chunk, "buckets": args.context_buckets}
    results["block_size"] = args.block_size
    results["compilers"] = {}
    for compiler in args.compilers.split(","):
        buckets = f"-l{args.context_buckets.replace(',', '_')}" if args.context_buckets else ""
        blocks = f"-k{args.block_size}" if args.block_size else ""
        shape = f"b{args.batch_size}-s{args.sequence_length}-c{args.chunk}{buckets}{blocks}"
        out = ARTIFACTS / f"{slug(model)}-{shape}-{compiler}"
        seconds = export(model, out, args, compiler)
        size = sum(p.stat().st_size for p in (out / "graphs").rglob("*") if p.is_file())
        figures = measure(out, hf, args)
        results["compilers"][compiler] = {"export_seconds": seconds, "graphs_bytes": size, **figures}
        for name, row in figures.items():
            (first, a), (second, b) = ((k.removesuffix("_ms"), v) for k, v in row.items() if k.endswith("_ms"))
            print(
                f"[graphs] {compiler:<8} {name:<18} {first} {a:8.1f} ms   {second} {b:8.1f} ms   ratio {row['ratio']:.2f}x",
                flush=True,
            )
        print(f"[graphs] {compiler:<8} export {seconds:.0f} s (0: cached), graphs {size / 2**20:.0f} MiB", flush=True)
    write_json(args.out, "graphs.json", results, "graphs")


if __name__ == "__main__":
    main()
