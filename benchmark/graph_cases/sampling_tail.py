"""What the decode graph's sampling section costs per feature: graphs.sample_rows (token bitmask, sampler, logit_bias
candidates, logprobs) on SmolLM2-sized logits, compiled (max_logprobs, max_logit_bias) as the A/B scripts compile
them, each traced as the CPU backend replays its programs. Same process, same threads, timings alternated.

    .venv/bin/python benchmark/graph_cases/sampling_tail.py [--threads 1] [--repeats 301] [--artifact A]

A decode step's A/B (device_logprobs.py, logit_bias.py) differs only in this section: its time difference is the cost
of the feature when unused, isolated from the two models' own timing spread. With --artifact (an on-device-sampling
export of the same vocabulary, e.g. logit_bias.py's "with" artifact) the same run also times that artifact's
decode step, and the differences are given as fractions of it.
Writes sampling_tail.json into --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import torch
from common import add_out, prompt_ids, write_json

from optimum_neuron_plugin.graph_inputs import SamplingInputs
from optimum_neuron_plugin.graphs import TOKEN_GENERATION, GraphSpec, example_inputs, sample_rows
from optimum_neuron_plugin.models.sampling import bitmask_words

VOCAB, MAX_TOPK = 49152, 256  # SmolLM2's vocabulary, the default max_topk
# (max_logprobs, max_logit_bias) as compiled by the A/B scripts' artifacts
VARIANTS = {"logprobs": (20, 32), "no-logprobs": (0, 32), "no-logit-bias": (20, 0)}


class Tail(torch.nn.Module):
    def __init__(self, spec: GraphSpec) -> None:
        super().__init__()
        self.spec = spec

    def forward(self, logits, *sampling):
        return sample_rows(
            self.spec, logits, SamplingInputs.unflat(self.spec, iter(sampling)), MAX_TOPK, vocab_size=VOCAB
        )


def traced(rows: int, logprobs: int, bias: int) -> tuple[torch.jit.ScriptModule, tuple]:
    spec = GraphSpec(TOKEN_GENERATION, rows, 1, True, 512, bitmask_words=bitmask_words(VOCAB), logprobs=logprobs,
                     logit_bias=bias)  # fmt: skip
    logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    sampling = list(example_inputs(spec)[3:])
    sampling[0] = torch.tensor([[50.0, 0.9, 0.8, 0.0]]).repeat(rows, 1)  # top-k 50, top-p 0.9, temperature 0.8
    sampling[1] = torch.full((rows, 1), 0.5)
    inputs = (logits, *sampling)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(Tail(spec), inputs, check_trace=False, strict=False), inputs


def measure(rows: int, repeats: int) -> dict:
    calls = {name: traced(rows, *variant) for name, variant in VARIANTS.items()}
    times = {name: [] for name in calls}
    for program, inputs in calls.values():
        program(*inputs), program(*inputs)  # warm-up
    for _ in range(repeats):
        for name, (program, inputs) in calls.items():
            began = time.perf_counter()
            program(*inputs)
            times[name].append(time.perf_counter() - began)
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return {
        **{f"{name}_ms": value for name, value in ms.items()},
        "logprobs_cost_ms": ms["logprobs"] - ms["no-logprobs"],
        "logit_bias_cost_ms": ms["logprobs"] - ms["no-logit-bias"],
    }


def decode_ms(artifact: Path, rows: int, repeats: int) -> float:
    from optimum_neuron_plugin import NeuronModelForCausalLM
    from optimum_neuron_plugin.sampling import SamplingParams

    model = NeuronModelForCausalLM.from_pretrained(artifact)
    context = min(300, model.neuron_config.sequence_length // 2)  # 300 on SmolLM2's artifacts
    tokens = prompt_ids(context, VOCAB)
    for slot in range(rows):
        model.prefill(slot, tokens)
    hot, times = SamplingParams(top_k=50, top_p=0.9, temperature=0.8), []
    for step in range(repeats + 1):
        began = time.perf_counter()
        model.decode(list(range(rows)), [7] * rows, [context + step % (context // 3)] * rows, [hot] * rows)
        times.append(time.perf_counter() - began)
    return statistics.median(times[1:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=301)
    parser.add_argument("--artifact", type=Path, default=None)
    add_out(parser, "sampling-tail")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {"threads": args.threads, "vocab": VOCAB, "max_topk": MAX_TOPK, "repeats": args.repeats}
    for rows in (4, 1):
        row = measure(rows, args.repeats)
        if args.artifact is not None:
            row["decode_step_ms"] = decode_ms(args.artifact, rows, 31)
            for cost in ("logprobs", "logit_bias"):
                row[f"{cost}_fraction_of_decode"] = row[f"{cost}_cost_ms"] / row["decode_step_ms"]
        results[f"rows_{rows}"] = row
        print(f"[sampling_tail] rows {rows}: " + "  ".join(f"{k} {v:.4f}" for k, v in row.items()), flush=True)
    if args.artifact is not None:
        results["artifact"] = args.artifact.name
    write_json(args.out, "sampling_tail.json", results, "sampling_tail")


if __name__ == "__main__":
    main()
