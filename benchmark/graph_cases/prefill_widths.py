"""Prefill time per prompt token by chunk width and prefill batch, against one pass over the whole prompt: the
exported chunked_prefill programs with the CPU backend's packed linears and chunk attention kernel, one process,
the cases alternated per round, best of the rounds.

    .venv/bin/python benchmark/graph_cases/prefill_widths.py [--model M.gguf] [--length 2048] [--rounds 3] [--threads 2]
        [--out benchmark/results/NAME]

Cases, each prefilling prompts of --length tokens from position 0 into fresh slots:
- width T (128, 256, 512): one prompt, chunk after chunk (the first chunk on the bucket-0 graph, the others on
  a graph whose prior bucket holds the whole prompt: the kernel reads each chunk's prior up to its start, so the
  bucket changes only the bias the graph builds);
- batch 4 x 128: four prompts side by side, chunk k of each in one call (--prefill-batch-size 4), per token;
- one pass: the whole prompt as one chunk (the bucket-0 graph of width --length), vLLM's single pass.
Programs are exported in process (torch.export, then the CPU backend's packed linears), not replayed by
TorchScript. Writes prefill_widths.json and prefill_widths.md into --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))


def program(args, params, caches, spec, packed):
    from optimum_neuron_plugin.backends.cpu_linear import packable, use_packed_linears
    from optimum_neuron_plugin.graphs import DecoderGraph, example_inputs

    graph = DecoderGraph(args, spec, 256)
    graph.kernel_ops = True
    with torch.no_grad():
        module = torch.export.export(graph, (params, caches, *example_inputs(spec)), strict=False).module()
    if packable():
        use_packed_linears(module, params, packed, spec.computed_tokens)
    return module


def main() -> None:
    from common import ARTIFACTS, default_model, hf_model, prompt_ids, slug

    from optimum_neuron_plugin.backends import cpu_attention  # noqa: F401 - the op's CPU kernel
    from optimum_neuron_plugin.graph_inputs import INDEX_DTYPE
    from optimum_neuron_plugin.graphs import CHUNKED_PREFILL, GraphSpec
    from optimum_neuron_plugin.models.kv_cache import empty_cache
    from optimum_neuron_plugin.runtime.artifact_io import to_params
    from optimum_neuron_plugin.sources import load_source, read_config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    gguf = options.model or default_model()
    hf_model(gguf)  # converts the checkpoint once
    directory = str(ARTIFACTS / f"{slug(gguf)}-hf")
    _, args = read_config(directory)
    params = to_params(load_source(directory).state_dict, args, torch.float32)
    length = options.length
    caches = empty_cache(args.num_hidden_layers, 4, length, args.num_key_value_heads, args.head_dim, torch.float32)
    packed: dict = {}
    cases = {f"width {t}": (1, t) for t in (128, 256, 512)} | {"batch 4 x 128": (4, 128), "one pass": (1, length)}
    programs = {}
    for name, (rows, width) in cases.items():
        print(f"[prefill_widths] exporting {name}", flush=True)
        first = GraphSpec(CHUNKED_PREFILL, rows, width, False, 0)
        later = GraphSpec(CHUNKED_PREFILL, rows, width, False, length) if width < length else None
        programs[name] = (
            program(args, params, caches, first, packed),
            later and program(args, params, caches, later, packed),
        )
    ids = prompt_ids(length, args.vocab_size)

    def prefill(name: str) -> float:
        (rows, width), (first, later) = cases[name], programs[name]
        seq_ids = torch.arange(rows, dtype=INDEX_DTYPE)
        began = time.perf_counter()
        for start in range(0, length, width):
            tokens = torch.tensor([ids[start : start + width]] * rows, dtype=INDEX_DTYPE)
            positions = torch.arange(start, start + width, dtype=INDEX_DTYPE)[None].expand(rows, -1).contiguous()
            (later if start else first)(params, caches, tokens, positions, seq_ids)
        return time.perf_counter() - began

    times: dict[str, list[float]] = {name: [] for name in cases}
    with torch.inference_mode():
        for name in cases:
            prefill(name)  # warm-up
        for round_ in range(options.rounds):
            for name in cases if round_ % 2 == 0 else list(cases)[::-1]:
                times[name].append(prefill(name))
                print(f"[prefill_widths] round {round_} {name}: {times[name][-1]:.2f} s", flush=True)
    per_token = {name: min(times[name]) / (length * cases[name][0]) for name in cases}
    rows = [{"case": name, "prompts": cases[name][0], "width": cases[name][1], "seconds": min(times[name]),
             "ms_per_token": per_token[name] * 1e3, "over_one_pass": per_token[name] / per_token["one pass"]}
            for name in cases]  # fmt: skip
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "prefill_widths.json").write_text(json.dumps({"rows": rows, "all_seconds": times}, indent=2) + "\n")
    lines = [
        f"Prefill of {length}-token prompts, {gguf.name}, fp32, {options.threads} threads, best of {options.rounds} "
        "(cases alternated)",
        "",
        "| case | prompts | s | ms per token | per token / one pass |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['case']} | {r['prompts']} | {r['seconds']:.2f} | {r['ms_per_token']:.3f} | {r['over_one_pass']:.2f} |"
        for r in rows
    ]
    (options.out / "prefill_widths.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
