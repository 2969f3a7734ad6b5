"""FP8 weights and FP8 KV cache against the fp32 model: greedy agreement, logit error, artifact size, CPU decode step.

    .venv/bin/python benchmark/graphs.py fp8-accuracy [-- --model MODEL --prompts 64 --tokens 64]

MODEL: a Hugging Face directory or a GGUF (converted once; default: the bundled SmolLM2). Accuracy runs the decoder eagerly (the
graphs' own code, models/decoder.py) in batches of 8 rows: per batch the fp32 model decodes greedily, and each variant
(FP8 weights, FP8 KV cache, both) runs (a) teacher-forced on the fp32 tokens: top-1 agreement and |logit - fp32
logit| per step; free-running greedy decoding feeds the same tokens up to its first disagreement, so the first
teacher-forced step whose top-1 differs is where its continuation diverges (identical continuations: none does). Then two
artifacts (fp32 and FP8 weights; one context_encoding and one token_generation graph, batch 1) are exported with
the CPU backend: their model.safetensors sizes, and one-row decode steps timed alternately.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import add_out, default_model, hf_directory

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.models import fp8
from optimum_neuron_plugin.models.decoder import decoder_logits
from optimum_neuron_plugin.models.kv_cache import empty_cache
from optimum_neuron_plugin.models.layers import rope_inv_freq
from optimum_neuron_plugin.runtime import fp8_params
from optimum_neuron_plugin.runtime.artifact_io import to_params
from optimum_neuron_plugin.sources import load_source

ROWS = 8
TOPICS = [
    "the ocean",
    "a rainy day",
    "coffee",
    "the moon",
    "a lost key",
    "mountains",
    "a city at night",
    "friendship",
    "bread",
    "a library",
    "trains",
    "winter",
    "a garden",
    "music",
    "the desert",
    "a robot",
    "rivers",
    "chess",
    "an old house",
    "the sun",
    "birds",
    "a market",
    "snow",
    "a bicycle",
    "the forest",
    "a letter",
    "clocks",
    "tea",
    "a bridge",
    "the stars",
    "a storm",
    "cats",
]
TEMPLATES = ["Write a short story about {}.", "Explain in simple words what {} is."]


def prompts(tokenizer, count: int) -> list[list[int]]:
    if tokenizer is None:  # a checkpoint without a tokenizer (a tiny test model): fixed random prompts
        generator = torch.Generator().manual_seed(0)
        return [torch.randint(0, 500, (12,), generator=generator).tolist() for _ in range(count)]
    texts = [template.format(topic) for template in TEMPLATES for topic in TOPICS][:count]
    if tokenizer.chat_template is None:  # e.g. a GGUF's tokenizer without its template: the plain text
        return [tokenizer(t)["input_ids"] for t in texts]
    chats = [[{"role": "user", "content": t}] for t in texts]
    return [
        tokenizer(tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True))["input_ids"]
        for c in chats
    ]


class Eager:
    """The decoder run eagerly on `params`, a cache of ROWS rows (FP8 when kv_scales are given)."""

    def __init__(self, args, params, length: int, fp8_cache: bool) -> None:
        self.args, self.params, self.length = args, params, length
        dtype = torch.float8_e4m3fn if fp8_cache else torch.float32
        self.caches = empty_cache(args.num_hidden_layers, ROWS, length, args.num_key_value_heads, args.head_dim, dtype)
        self.inv_freq = rope_inv_freq(args)

    def prefill(self, row: int, ids: list[int]) -> torch.Tensor:
        tokens = torch.tensor([ids], dtype=torch.int32)
        positions = torch.arange(len(ids), dtype=torch.int32)[None]
        seq = torch.tensor([[row]], dtype=torch.int32)  # block tables: one block of `length` per row
        return decoder_logits(self.args, self.params, self.caches, self.inv_freq, tokens, positions, seq, self.length)[
            0
        ]

    def decode(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        ids = torch.tensor(tokens, dtype=torch.int32)[:, None]
        pos = torch.tensor(positions, dtype=torch.int32)[:, None]
        seq = torch.arange(len(tokens), dtype=torch.int32)[:, None]
        return decoder_logits(self.args, self.params, self.caches, self.inv_freq, ids, pos, seq, self.length)


def run(model: Eager, batch: list[list[int]], steps: int, forced: list[list[int]] | None):
    """Greedy decode of the batch (rows padded to ROWS by repeating the last prompt); with `forced`, the given
    tokens are fed instead of the model's own. Returns (tokens [rows][steps], logits per step [rows, V])."""
    batch = batch + [batch[-1]] * (ROWS - len(batch))
    logits = torch.stack([model.prefill(row, ids) for row, ids in enumerate(batch)])
    tokens, per_step = [], []
    for step in range(steps):
        per_step.append(logits[: len(batch)])
        chosen = logits.argmax(-1).tolist()
        tokens.append(chosen)
        fed = [forced[row][step] for row in range(ROWS)] if forced else chosen
        logits = model.decode(fed, [len(ids) + step for ids in batch])
    return [list(t) for t in zip(*tokens, strict=True)], per_step


@torch.inference_mode()
def accuracy(args, state, tokenizer, count: int, steps: int) -> dict:
    exact = to_params(state, args, torch.float32)
    # FP8 bytes upcast once: every E4M3 value is exact in fp32, so fp8.linear computes the same numbers per call
    # without converting the weights at every step (the slow part of an eager CPU run).
    quantized = {
        name: tensor.float() if fp8.is_fp8(tensor) else tensor
        for name, tensor in to_params(state, args, torch.float32, NeuronConfig(quantization="fp8")).items()
    }
    variants = {
        "fp8 weights": (quantized, False),
        "fp8 kv": (exact | fp8_params.calibrated_kv_scales(args, exact, tokenizer), True),
        "fp8 both": (quantized | fp8_params.calibrated_kv_scales(args, quantized, tokenizer), True),
    }
    all_prompts = prompts(tokenizer, count)
    length = max(map(len, all_prompts)) + steps + 1
    stats = {name: dict(agree=0, total=0, errors=[], maxerr=0.0, same=0, diverge=[]) for name in variants}
    for start in range(0, count, ROWS):
        batch = all_prompts[start : start + ROWS]
        ref_tokens, ref_logits = run(Eager(args, exact, length, False), batch, steps, None)
        padded = ref_tokens + [ref_tokens[-1]] * (ROWS - len(ref_tokens))
        for name, (params, fp8_cache) in variants.items():
            s = stats[name]
            _, logits = run(Eager(args, params, length, fp8_cache), batch, steps, padded)
            n = len(batch)
            agrees = []
            for ref, got in zip(ref_logits, logits, strict=True):
                agree = got[:n].argmax(-1) == ref[:n].argmax(-1)
                agrees.append(agree)
                s["agree"] += int(agree.sum())
                s["total"] += n
                diff = (got[:n] - ref[:n]).abs()
                s["errors"].append(float(diff.mean()))
                s["maxerr"] = max(s["maxerr"], float(diff.max()))
            # Free-running greedy decoding feeds the fp32 tokens up to its first disagreement: it diverges at the
            # first teacher-forced step whose top-1 differs, and is identical where none does.
            for row in range(n):
                first = next((i for i, agree in enumerate(agrees) if not bool(agree[row])), steps)
                s["same"] += first == steps
                s["diverge"].append(first)
        print(f"prompts {start + len(batch)}/{count}", flush=True)
    return {
        name: {
            "teacher_forced_top1_agreement": s["agree"] / s["total"],
            "mean_abs_logit_error": statistics.mean(s["errors"]),
            "max_abs_logit_error": s["maxerr"],
            "identical_continuations": f"{s['same']}/{count}",
            "mean_first_divergence_step": statistics.mean(s["diverge"]),
        }
        for name, s in stats.items()
    }


@torch.inference_mode()
def artifacts(model_dir: str, rounds: int, max_positions: int) -> dict:
    length = min(256, max_positions)
    shape = dict(batch_size=1, sequence_length=length, prefill_chunk_size=0, on_device_sampling=False)
    root = Path(tempfile.mkdtemp(prefix="fp8-bench-"))
    try:
        loaded, sizes = {}, {}
        for name, extra in (("fp32", {}), ("fp8 weights", {"quantization": "fp8"})):
            NeuronModelForCausalLM.export(model_dir, NeuronConfig(**shape, **extra)).save_pretrained(root / name)
            sizes[name] = (root / name / "model.safetensors").stat().st_size
            loaded[name] = NeuronModelForCausalLM.from_pretrained(root / name)
            loaded[name].prefill(0, list(range(1, 101)))
        times = {name: [] for name in loaded}
        for round_ in range(rounds):
            for name, model in loaded.items() if round_ % 2 else reversed(loaded.items()):
                began = time.perf_counter()
                model.decode([0], [7], [100 + round_ % 20])
                times[name].append(time.perf_counter() - began)
        median = {name: statistics.median(t[2:]) for name, t in times.items()}
        fp32_params = sum(t.numel() * t.element_size() for t in loaded["fp32"].params.values())
        return {
            "model.safetensors bytes": sizes,
            "fp8 / fp32 file": sizes["fp8 weights"] / sizes["fp32"],
            "fp8 / bf16 file (bf16 = fp32 params / 2)": sizes["fp8 weights"] / (fp32_params / 2),
            "decode step median s (1 row, context 100-120)": median,
            "fp8 / fp32 decode step": median["fp8 weights"] / median["fp32"],
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=None, help="HF directory or GGUF (default: the bundled SmolLM2)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    add_out(parser, "fp8-accuracy")
    options = parser.parse_args()
    torch.set_num_threads(2)
    model = str(hf_directory(options.model or default_model()))
    source = load_source(model)
    result = {"fp8_max_weights": fp8.OCP_MAX, "kv_headroom": fp8_params.KV_HEADROOM}
    result["accuracy"] = accuracy(source.args, source.state_dict, source.tokenizer, options.prompts, options.tokens)
    print(json.dumps(result["accuracy"], indent=2), flush=True)
    result["artifacts"] = artifacts(model, options.rounds, source.args.max_position_embeddings)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
