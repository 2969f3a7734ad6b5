"""What on-device logit_bias costs: the decode graphs taking max_logit_bias (token id, bias) pairs per row against the
same graphs without that input (max_logit_bias 0), and a step whose rows carry pairs and min_p against one whose rows
carry none. Same process, same threads, timings alternated, ratios printed (below 1.0: faster with the feature).

    .venv/bin/python benchmark/graph_cases/logit_bias.py [--threads 1] [--context 300] [--compiler export]

Exports SmolLM2 twice (cached under benchmark/results/artifacts/; the first is device_logprobs.py's "with" artifact),
both with max_logprobs 20, then measures at --context positions:
- decode / decode_1: a token_generation call of batch_size rows / one row without any bias (the runtime passes zero
  pairs), with the input against without: the cost when unused;
- chunk_and_decode: the fused call, likewise;
- biased_decode: on the artifact with the input, every row carrying max_logit_bias pairs and min_p 0.05 against
  rows carrying none: what using them adds on device.
Writes logit_bias.json into --out.
"""

from __future__ import annotations

import argparse
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


def measure(with_bias: Path, without: Path, args: argparse.Namespace) -> dict:
    from optimum_neuron_plugin import NeuronModelForCausalLM
    from optimum_neuron_plugin.sampling import SamplingParams

    models = {
        "with": NeuronModelForCausalLM.from_pretrained(with_bias),
        "without": NeuronModelForCausalLM.from_pretrained(without),
    }
    batch = args.batch_size
    vocab = models["with"].args.vocab_size
    slots = models["with"].neuron_config.max_logit_bias
    tokens = prompt_ids(2 * args.chunk, vocab)
    for model in models.values():
        for slot in range(batch):
            model.prefill(slot, tokens[: args.context])
    step = {name: args.context for name in ("with", "without", "with_1", "without_1", "biased", "plain")}
    hot = SamplingParams(top_k=50, top_p=0.9, temperature=0.8)
    biased = SamplingParams(
        top_k=50, top_p=0.9, temperature=0.8, min_p=0.05, logit_bias=tuple((t * 131 % vocab, 2.0) for t in range(slots))
    )

    def decode(name: str, rows: int, at: str, sampling: SamplingParams = hot, model: str | None = None):
        def call():
            models[model or name].decode(list(range(batch))[-rows:], [7] * rows, [step[at]] * rows, [sampling] * rows)
            step[at] += 1

        return call

    decoding, positions = list(range(batch - 1)), [args.context] * (batch - 1)

    def fused(name: str):
        def call():
            models[name].prefill_and_decode(
                batch - 1, tokens[args.chunk : 2 * args.chunk], args.chunk, decoding, [7] * len(decoding), positions,
                [hot] * len(decoding),
            )  # fmt: skip

        return call

    pair = ("with", "without")
    return {
        "decode": alternate(decode("with", batch, "with"), decode("without", batch, "without"), args.repeats, pair),
        "decode_1": alternate(decode("with", 1, "with_1"), decode("without", 1, "without_1"), args.repeats, pair),
        "chunk_and_decode": alternate(fused("with"), fused("without"), args.repeats, pair),
        "biased_decode": alternate(
            decode("biased", batch, "biased", biased, "with"), decode("plain", batch, "plain", hot, "with"),
            args.repeats, ("biased", "plain"),
        ),
    }  # fmt: skip


def main() -> None:
    parser = ab_parser(__doc__)
    parser.add_argument("--max-logit-bias", type=int, default=32)
    parser.add_argument("--export-only", action="store_true", help="export the artifacts (outside any timing) and stop")
    add_out(parser, "logit-bias-with-vs-without")
    args = parser.parse_args()
    model = args.model or default_model()
    torch.set_num_threads(args.threads)
    name = ab_artifact_name(args)
    options = dict(max_logprobs=20)
    with_bias = export_variant(
        model, ARTIFACTS / f"{name}-{args.compiler}-logprobs", args, max_logit_bias=args.max_logit_bias, **options
    )
    without = export_variant(
        model, ARTIFACTS / f"{name}-{args.compiler}-no-logit-bias", args, max_logit_bias=0, **options
    )
    if args.export_only:
        return
    figures = measure(with_bias, without, args)
    for key, row in figures.items():
        (first, a), (second, b) = ((k.removesuffix("_ms"), v) for k, v in row.items() if k.endswith("_ms"))
        print(f"[logit_bias] {key:<17} {first} {a:8.2f} ms   {second} {b:8.2f} ms   ratio {row['ratio']:.3f}x")
    results = {
        "threads": args.threads, "context": args.context, "compiler": args.compiler, "artifact": name,
        "max_logit_bias": args.max_logit_bias, "repeats": args.repeats, **figures,
    }  # fmt: skip
    write_json(args.out, "logit_bias.json", results, "logit_bias")


if __name__ == "__main__":
    main()
