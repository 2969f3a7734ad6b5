"""Decode step and prefill chunk of a small random Qwen3-MoE on the CPU backend, against a dense Qwen3 of the same
active parameters and against running every expert, all in one run, calls interleaved (ratios only).

    .venv/bin/python benchmark/graph_cases/moe.py [--out DIR] [--artifacts DIR [--export-only]]

Four exports of the same shape: the MoE model as exported (a decode step gathers its tokens' experts, a chunk runs
every expert densely weighted), the MoE model with every graph running every expert ("all experts"), the MoE model
with every graph gathering ("gathered chunk": the chunk strategy's alternative), and a dense Qwen3 whose MLP
size is k experts' (the same weights per token). Each measurement alternates the variants call by call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch
from common import add_out, write_json
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.backends.program_cache import CACHE_ENV
from optimum_neuron_plugin.models import moe

COMMON = dict(
    vocab_size=512, hidden_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
    max_position_embeddings=256, tie_word_embeddings=False, initializer_range=0.05,
)  # fmt: skip


@contextmanager
def strategy(gather: bool | None):
    """Exports every graph with one expert strategy (None: the plugin's per-graph choice)."""
    if gather is None:
        yield
        return
    # The compile cache (ONP_CPU_COMPILE_CACHE) keys a program by its shapes and options, which a patched strategy
    # leaves as they are: the variant is exported without it, so that it never reuses the default's programs.
    with mock.patch.object(moe, "gathers_experts", lambda tokens, args: gather), mock.patch.dict(os.environ):
        os.environ.pop(CACHE_ENV, None)
        yield


def export(hf, root: Path, name: str, shape: dict, gather: bool | None = None) -> Path:
    """The artifact `name` under root, exported unless root already holds it (--artifacts)."""
    if (root / name / "neuron_config.json").is_file():
        return root / name
    source = root / f"{name}-hf"
    hf.save_pretrained(source)
    with strategy(gather):
        exported = NeuronModelForCausalLM.export(source, NeuronConfig(**shape))
    exported.save_pretrained(root / name)
    return root / name


def variant_name(args: argparse.Namespace) -> str:
    return f"h{args.hidden}-e{args.experts}-k{args.top_k}-i{args.expert_size}-b{args.batch_size}-c{args.chunk}"


def interleaved(calls: dict, repeats: int) -> dict[str, float]:
    """Median seconds per call of each variant, the variants called in turn."""
    times = {name: [] for name in calls}
    for call in calls.values():  # warm-up
        call()
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert-size", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    add_out(parser, "moe-decode-vs-dense-same-active")
    parser.add_argument("--artifacts", type=Path, default=None, help="keep the exports here and reuse them")
    parser.add_argument("--export-only", action="store_true", help="export (outside the benchmark lock) and stop")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    COMMON["hidden_size"] = args.hidden
    moe_hf = Qwen3MoeForCausalLM(
        Qwen3MoeConfig(
            **COMMON,
            num_experts=args.experts,
            num_experts_per_tok=args.top_k,
            norm_topk_prob=True,
            moe_intermediate_size=args.expert_size,
            intermediate_size=args.top_k * args.expert_size,
        )  # fmt: skip
    )
    dense_hf = Qwen3ForCausalLM(Qwen3Config(**COMMON, intermediate_size=args.top_k * args.expert_size))
    shape = dict(
        batch_size=args.batch_size, sequence_length=2 * args.chunk, prefill_chunk_size=args.chunk,
        context_buckets=(2 * args.chunk,), prefill_buckets=(0, 2 * args.chunk), on_device_sampling=False,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) if args.artifacts is None else args.artifacts / variant_name(args)
        paths = {
            "moe": export(moe_hf, root, "moe", shape),
            "all_experts": export(moe_hf, root, "all", shape, gather=False),
            "gathered_chunk": export(moe_hf, root, "gathered", shape, gather=True),
            "dense_same_active": export(dense_hf, root, "dense", shape),
        }
        if args.export_only:
            return
        models = {name: NeuronModelForCausalLM.from_pretrained(path) for name, path in paths.items()}
        prompt = torch.randint(0, COMMON["vocab_size"], (args.chunk,)).tolist()
        rows = list(range(args.batch_size))
        for model in models.values():
            for row in rows:
                model.prefill(row, prompt)

        def decode(model, n):
            return lambda: model.decode(rows[:n], prompt[:n], [args.chunk] * n)

        def chunk(model):
            return lambda: model.prefill(0, prompt)

        decode_variants = ("moe", "all_experts", "dense_same_active")
        decode_1 = interleaved({k: decode(models[k], 1) for k in decode_variants}, args.repeats)
        decode_b = interleaved({k: decode(models[k], args.batch_size) for k in decode_variants}, args.repeats)
        chunks = interleaved(
            {k: chunk(models[k]) for k in ("moe", "gathered_chunk", "dense_same_active")}, args.repeats
        )
    result = {
        "command": "benchmark/graph_cases/moe.py "
        + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("artifacts", "export_only")
        ),
        "model": dict(COMMON, experts=args.experts, top_k=args.top_k, expert_size=args.expert_size),
        "shape": {k: list(v) if isinstance(v, tuple) else v for k, v in shape.items()},
        "seconds": {"decode_1_row": decode_1, f"decode_{args.batch_size}_rows": decode_b, "chunk": chunks},
        "ratios": {
            "decode_1_row_moe_vs_dense_same_active": decode_1["moe"] / decode_1["dense_same_active"],
            "decode_1_row_moe_vs_all_experts": decode_1["moe"] / decode_1["all_experts"],
            f"decode_{args.batch_size}_rows_moe_vs_dense_same_active": decode_b["moe"] / decode_b["dense_same_active"],
            f"decode_{args.batch_size}_rows_moe_vs_all_experts": decode_b["moe"] / decode_b["all_experts"],
            "chunk_dense_experts_vs_gathered": chunks["moe"] / chunks["gathered_chunk"],
            "chunk_moe_vs_dense_same_active": chunks["moe"] / chunks["dense_same_active"],
        },
    }
    print(json.dumps(result["ratios"], indent=2))
    write_json(args.out, f"qwen3moe-e{args.experts}-k{args.top_k}-h{args.hidden}.json", result, "moe")


if __name__ == "__main__":
    main()
