"""What on-device logprobs cost: the decode graphs that return vLLM's raw logprobs (the sampled token's logprob and
rank, the top max_logprobs) against the same graphs returning tokens only (max_logprobs 0). Same process, same
threads, timings alternated, ratios printed (below 1.0: faster with logprobs).

    .venv/bin/python benchmark/graph_cases/device_logprobs.py [--threads 1] [--context 300] [--compiler export]

Exports SmolLM2 twice (cached under benchmark/results/artifacts/), then measures at --context positions:
- decode / decode_1: a token_generation call of batch_size rows / one row, with logprobs against without;
- chunk_and_decode: the fused call with logprobs against without.
The graphs compute the logprobs on every call (a request that asks for none ignores them), so these ratios are also
the cost when unused. Writes device_logprobs.json into --out.
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


def measure(with_logprobs: Path, without: Path, args: argparse.Namespace) -> dict:
    from optimum_neuron_plugin import NeuronModelForCausalLM

    models = {
        "with": NeuronModelForCausalLM.from_pretrained(with_logprobs),
        "without": NeuronModelForCausalLM.from_pretrained(without),
    }
    batch = args.batch_size
    vocab = models["with"].args.vocab_size
    tokens = prompt_ids(2 * args.chunk, vocab)
    for model in models.values():
        for slot in range(batch):
            model.prefill(slot, tokens[: args.context])
    step = {name: args.context for name in ("with", "without", "with_1", "without_1")}

    def decode(name: str, rows: int, at: str):
        def call():
            models[name].decode(list(range(batch))[-rows:], [7] * rows, [step[at]] * rows)
            step[at] += 1

        return call

    decoding, positions = list(range(batch - 1)), [args.context] * (batch - 1)

    def fused(name: str):
        def call():
            models[name].prefill_and_decode(
                batch - 1, tokens[args.chunk : 2 * args.chunk], args.chunk, decoding, [7] * len(decoding), positions
            )

        return call

    pair = ("with", "without")
    return {
        "decode": alternate(decode("with", batch, "with"), decode("without", batch, "without"), args.repeats, pair),
        "decode_1": alternate(decode("with", 1, "with_1"), decode("without", 1, "without_1"), args.repeats, pair),
        "chunk_and_decode": alternate(fused("with"), fused("without"), args.repeats, pair),
    }


def main() -> None:
    parser = ab_parser(__doc__)
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument("--export-only", action="store_true", help="export the artifacts (outside any timing) and stop")
    add_out(parser, "device-logprobs")
    args = parser.parse_args()
    model = args.model or default_model()
    torch.set_num_threads(args.threads)
    name = ab_artifact_name(args)
    with_logprobs = export_variant(
        model, ARTIFACTS / f"{name}-{args.compiler}-logprobs", args, max_logprobs=args.max_logprobs
    )
    without = export_variant(model, ARTIFACTS / f"{name}-{args.compiler}-no-logprobs", args, max_logprobs=0)
    if args.export_only:
        return
    figures = measure(with_logprobs, without, args)
    for key, row in figures.items():
        print(f"[device_logprobs] {key:<17} with {row['with_ms']:8.2f} ms   without {row['without_ms']:8.2f} ms   "
              f"ratio {row['ratio']:.3f}x")  # fmt: skip
    results = {
        "threads": args.threads, "context": args.context, "compiler": args.compiler, "artifact": name,
        "max_logprobs": args.max_logprobs, **figures,
    }  # fmt: skip
    write_json(args.out, "device_logprobs.json", results, "device_logprobs")


if __name__ == "__main__":
    main()
