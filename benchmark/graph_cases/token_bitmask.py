"""What structured outputs cost: the decode graphs with the token bitmask input against the same graphs without it,
and a structured step's added time. Same process, same threads, timings alternated, ratios printed.

    .venv/bin/python benchmark/graph_cases/token_bitmask.py [--threads 1] [--context 300] [--compiler export]

Exports SmolLM2 twice (cached under benchmark/results/artifacts/): as this plugin does (token_generation and
chunk_and_decode take the packed bitmask) and with token_bitmask=false (the graphs of a format-4 export, no such
input). Then measures, at --context positions:
- decode / decode_1: unstructured traffic, a token_generation call of batch_size rows / one row (the runtime passes
  an all-ones bitmask), with the feature against without (below 1.0: faster with it);
- chunk_and_decode: the fused call with the feature against without;
- structured_decode: a decode call whose rows carry real grammar bitmasks (a JSON schema's first-token mask from
  xgrammar) against the same call with all ones: what masking adds on device;
- host_mask: vLLM's apply_grammar_bitmask on batch_size rows of host logits (host sampling, every first token):
  milliseconds added per step, against one decode call.
Writes token_bitmask.json into --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from common import (
    ARTIFACTS,
    ab_artifact_name,
    ab_parser,
    add_out,
    alternate,
    default_model,
    export_variant,
    prompt_ids,
    write_json,
)


def schema_bitmask(directory: Path, rows: int) -> torch.Tensor:
    """xgrammar's bitmask of a JSON schema's first token, for every row (what vLLM's scheduler would send)."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    vocab = json.loads((directory / "config.json").read_text())["vocab_size"]
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema)))
    bitmask = xgr.allocate_token_bitmask(rows, vocab)
    for row in range(rows):
        matcher.fill_next_token_bitmask(bitmask, row)
    return bitmask


def measure(with_mask: Path, without: Path, args: argparse.Namespace) -> dict:
    from optimum_neuron_plugin import NeuronModelForCausalLM

    models = {
        "with": NeuronModelForCausalLM.from_pretrained(with_mask),
        "without": NeuronModelForCausalLM.from_pretrained(without),
    }
    batch = args.batch_size
    vocab = models["with"].args.vocab_size
    tokens = prompt_ids(2 * args.chunk, vocab)
    context = tokens[: args.context]
    for model in models.values():
        for slot in range(batch):
            model.prefill(slot, context)
    step = {name: args.context for name in ("with", "without", "with_1", "without_1", "masked", "ones")}

    def decode(name: str, rows: int, at: str, bitmask=None):
        model = models[name]

        def call():
            slots = list(range(batch))[-rows:]
            model.decode(slots, [7] * rows, [step[at]] * rows, bitmask=bitmask)
            step[at] += 1

        return call

    decoding = list(range(batch - 1))
    positions = [args.context] * (batch - 1)

    def fused(name: str):
        def call():
            models[name].prefill_and_decode(
                batch - 1, tokens[args.chunk : 2 * args.chunk], args.chunk, decoding, [7] * len(decoding), positions
            )

        return call

    grammar = schema_bitmask(with_mask, batch)
    ones = torch.full_like(grammar, -1)
    logits = torch.randn(batch, vocab)
    measures = {
        "decode": lambda: alternate(decode("with", batch, "with"), decode("without", batch, "without"), args.repeats, ("with", "without")),
        "decode_1": lambda: alternate(decode("with", 1, "with_1"), decode("without", 1, "without_1"), args.repeats, ("with", "without")),
        "chunk_and_decode": lambda: alternate(fused("with"), fused("without"), args.repeats, ("with", "without")),
        "structured_decode": lambda: alternate(
            decode("with", batch, "masked", grammar), decode("with", batch, "ones", ones), args.repeats, ("masked", "ones")
        ),
        "host_mask": lambda: alternate(lambda: host_mask(logits, grammar), decode("without", batch, "without"), args.repeats, ("host_mask", "decode")),
    }  # fmt: skip
    results = {name: measure() for name, measure in measures.items() if name in args.only.split(",")}
    print(f"[token_bitmask] allowed tokens in the schema's first-token mask: {allowed(grammar[0], vocab)} of {vocab}")
    return results


def host_mask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """What the runner does to host logits of a structured step (vllm.v1.structured_output.utils)."""
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits.clone(), bitmask)


def allowed(row: torch.Tensor, vocab: int) -> int:
    bits = (row[:, None].long() >> torch.arange(32)) & 1
    return int(bits.flatten()[:vocab].sum())


def main() -> None:
    parser = ab_parser(__doc__, sequence_length=2048, context_buckets="512,2048")
    parser.add_argument("--only", default="decode,decode_1,chunk_and_decode,structured_decode,host_mask")
    add_out(parser, "token-bitmask-with-vs-without")
    args = parser.parse_args()
    model = args.model or default_model()
    torch.set_num_threads(args.threads)
    name = ab_artifact_name(args)
    with_mask = export_variant(model, ARTIFACTS / f"{name}-{args.compiler}", args, token_bitmask=True)
    without = export_variant(model, ARTIFACTS / f"{name}-{args.compiler}-no-bitmask", args, token_bitmask=False)
    figures = measure(with_mask, without, args)
    for key, row in figures.items():
        (first, a), (second, b) = ((k.removesuffix("_ms"), v) for k, v in row.items() if k.endswith("_ms"))
        print(f"[token_bitmask] {key:<18} {first} {a:8.2f} ms   {second} {b:8.2f} ms   ratio {row['ratio']:.3f}x")
    results = {"threads": args.threads, "context": args.context, "compiler": args.compiler, "artifact": name, **figures}
    write_json(args.out, "token_bitmask.json", results, "token_bitmask")


if __name__ == "__main__":
    main()
