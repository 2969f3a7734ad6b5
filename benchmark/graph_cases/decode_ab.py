"""Two artifacts' decode steps side by side: per context bucket, batch_size rows decoding near a context in that
bucket, the two artifacts' calls alternated in one process (median of --repeats after 3 warm-up calls each), then
both artifacts' next token after the same prompt (equal when the two compute the same thing). With --graph-rounds N,
also every graph the two artifacts share, each timed on its example inputs (runtime/latency.py: the fastest of 3
calls), the two artifacts in turns N times, the fastest of all.

    .venv/bin/python benchmark/graph_cases/decode_ab.py ARTIFACT_A ARTIFACT_B [--contexts 200,300,1100,1200,1600]
        [--graph-rounds 3]

Used to compare two builds of one model (e.g. two attention forms, each exported from its own source tree).
Writes decode_ab.json and decode_ab.md into --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import add_out, alternate, write_json


def main() -> None:
    from optimum_neuron_plugin import NeuronModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--contexts", default="200,300,1100,1200,1600")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--graph-rounds", type=int, default=0, help="time every shared graph this many rounds")
    add_out(parser, "decode-ab")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {
        "a": NeuronModelForCausalLM.from_pretrained(str(args.a)),
        "b": NeuronModelForCausalLM.from_pretrained(str(args.b)),
    }
    rows = models["a"].neuron_config.batch_size
    results = {}
    for context in (int(c) for c in args.contexts.split(",")):
        step = {"a": context, "b": context}

        def call(name: str, step: dict = step):
            def decode():
                models[name].decode(list(range(rows)), [7] * rows, [step[name]] * rows)
                step[name] += 1

            return decode

        results[f"context_{context}"] = alternate(call("a"), call("b"), args.repeats, ("a", "b"))
    prompt = list(range(100, 100 + min(300, models["a"].neuron_config.sequence_length // 2)))
    tokens = {
        name: model.decode([0], [int(model.prefill(0, prompt).argmax())], [len(prompt)])
        for name, model in models.items()
    }
    same = repr(tokens["a"]) == repr(tokens["b"])
    lines = [f"Decode step of {rows} rows: A {args.a.name}, B {args.b.name}, {args.threads} threads", ""]
    lines += ["| context | A ms | B ms | A / B |", "|---:|---:|---:|---:|"]
    lines += [
        f"| {k.removeprefix('context_')} | {r['a_ms']:.1f} | {r['b_ms']:.1f} | {r['ratio']:.2f} |"
        for k, r in results.items()
    ]
    lines += ["", f"Same next token after a {len(prompt)}-token prompt: {same}"]
    graphs = graph_latencies(models, args.graph_rounds) if args.graph_rounds else {}
    if graphs:
        lines += ["", f"Every shared graph on its example inputs, fastest of {args.graph_rounds} rounds of 3 calls", ""]
        lines += ["| graph (kind, rows, bucket, tail) | A ms | B ms | A / B |", "|---|---:|---:|---:|"]
        lines += [f"| {key} | {t['a']:.1f} | {t['b']:.1f} | {t['a'] / t['b']:.2f} |" for key, t in graphs.items()]
    print("\n".join(lines))
    write_json(
        args.out,
        "decode_ab.json",
        {
            "a": str(args.a),
            "b": str(args.b),
            **results,
            "same_token": same,
            "graphs_ms": {str(k): t for k, t in graphs.items()},
        },
        "decode_ab",
    )
    (args.out / "decode_ab.md").write_text("\n".join(lines) + "\n")


def graph_latencies(models: dict, rounds: int) -> dict:
    """Milliseconds of one call of each graph both models have, by graph key: the fastest over `rounds` turns."""
    best: dict = {}
    for _ in range(rounds):
        for name, model in models.items():
            for key, seconds in model.measure_latencies(lambda spec: True).seconds.items():
                times = best.setdefault(key, {})
                times[name] = min(times.get(name, float("inf")), seconds * 1e3)
    return {key: times for key, times in best.items() if len(times) == len(models)}


if __name__ == "__main__":
    main()
