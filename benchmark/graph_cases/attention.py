"""Chunk attention forms on the host, one layer of SmolLM2-135M's shapes (9 heads over 3 KV heads, head_dim 64):
the attention time of a prompt fed chunk by chunk, summed over its chunks, as ratios to HF's causal SDPA of the
whole prompt in the same run (best of --repeats, forms alternated).

    .venv/bin/python benchmark/graph_cases/attention.py [--prompt 4096] [--chunk 512] [--out DIR] [--decoder [--model M]]

- bucket:     each chunk attends its whole context bucket (the smallest > its last position) under a causal mask
- fused:      prior context [0, P) (P: the smallest prefill bucket >= the chunk's start) and the own block in one
              SDPA over the keys [prior | own] (the kernel's running max/sum merges the two partial softmaxes)
- lse:        the same two pieces as materialised partial softmaxes merged explicitly by their log-sum-exp
Ladders: the doubling context buckets, and the default prefill buckets (config.default_prefill_buckets).

With --decoder, the whole SmolLM2 decoder instead (eager, 30 layers, the bundled GGUF): each chunk of the prompt
run in the bucket form and in the fused form, alternated chunk by chunk in one process (same weights, same
threads), as the ratio fused / bucket.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from common import add_out, call_seconds, default_model, prompt_ids

from optimum_neuron_plugin.config import default_context_buckets, default_prefill_buckets
from optimum_neuron_plugin.models.masks import MASK_FILL

KV_HEADS, GROUPS, DIM = 3, 3, 64


def _bias(mask: torch.Tensor) -> torch.Tensor:
    t, keys = mask.shape
    mask = mask[None, None, None].expand(1, 1, GROUPS, t, keys).reshape(1, 1, GROUPS * t, keys)
    return torch.zeros(mask.shape).masked_fill(~mask, MASK_FILL)


def bucket_form(start: int, chunk: int, buckets) -> callable:
    length = next(b for b in buckets if b > start + chunk - 1)
    q, k, v = (torch.randn(1, KV_HEADS, n, DIM) for n in (GROUPS * chunk, length, length))
    bias = _bias(torch.arange(length)[None, :] <= torch.arange(start, start + chunk)[:, None])
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def _pieces(start: int, chunk: int, prior_buckets):
    prior = next(b for b in prior_buckets if b >= start)
    q = torch.randn(1, KV_HEADS, GROUPS * chunk, DIM)
    k, v, kn, vn = (torch.randn(1, KV_HEADS, n, DIM) for n in (prior, prior, chunk, chunk))
    older = (torch.arange(prior) < start)[None, :].expand(chunk, prior)
    own = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    return q, k, v, kn, vn, older, own


def fused_form(start: int, chunk: int, prior_buckets) -> callable:
    q, k, v, kn, vn, older, own = _pieces(start, chunk, prior_buckets)
    bias = _bias(torch.cat((older, own), dim=1))
    return lambda: F.scaled_dot_product_attention(q, torch.cat((k, kn), 2), torch.cat((v, vn), 2), attn_mask=bias)


def lse_form(start: int, chunk: int, prior_buckets) -> callable:
    q, k, v, kn, vn, older, own = _pieces(start, chunk, prior_buckets)
    older_bias, own_bias, scale = _bias(older[:1])[:, :, :1], _bias(own), 1 / math.sqrt(DIM)

    def piece(keys, values, bias):
        scores = torch.matmul(q, keys.transpose(-1, -2)) * scale + bias
        top = scores.amax(-1, keepdim=True)
        weights = torch.softmax(scores, -1)  # softmax, not exp(): CPU exp() of the fill takes a slow path
        return torch.matmul(weights, values), top - torch.log(weights.amax(-1, keepdim=True))  # lse = max + log sum

    def run():
        (o1, l1), (o2, l2) = piece(kn, vn, own_bias), (piece(k, v, older_bias) if k.shape[2] else (0, None))
        if l1 is None or l2 is None:
            return o2 if l1 is None else o1
        lse = torch.logaddexp(l1, l2)
        return o1 * torch.exp(l1 - lse) + o2 * torch.exp(l2 - lse)

    return run


def decoder_forms(model: Path, prompt: int, chunk: int, context, prefill) -> dict[str, list]:
    """Per chunk, a call of the eager decoder in the bucket form and in the fused form (same cache)."""
    from optimum_neuron_plugin.models.decoder import decoder_logits
    from optimum_neuron_plugin.models.kv_cache import empty_cache
    from optimum_neuron_plugin.models.layers import rope_inv_freq
    from optimum_neuron_plugin.sources import load_source

    source = load_source(model)
    args, params = source.args, {k: v.float().contiguous() for k, v in source.state_dict.items()}
    caches = empty_cache(args.num_hidden_layers, 1, context[-1], args.num_key_value_heads, args.head_dim, torch.float32)
    inv_freq, seq = rope_inv_freq(args), torch.zeros(1, 1, dtype=torch.int32)  # one block: the whole row
    tokens = torch.tensor([prompt_ids(prompt, args.vocab_size)], dtype=torch.int32)

    def call(start: int, fused: bool):
        ids, positions = tokens[:, start : start + chunk], torch.arange(start, start + chunk, dtype=torch.int32)[None]
        bucket = next(b for b in prefill if b >= start) if fused else next(b for b in context if b > start + chunk - 1)
        return lambda: torch.inference_mode()(decoder_logits)(
            args, params, caches, inv_freq, ids, positions, seq, bucket, chunk=fused
        )

    starts = range(0, prompt, chunk)
    return {
        "bucket (context buckets)": [call(s, False) for s in starts],
        "fused (prefill buckets)": [call(s, True) for s in starts],
    }


def best(fn, repeats: int) -> float:
    return min(call_seconds(fn, repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--sequence-length", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    add_out(parser, "attention-split")
    parser.add_argument("--decoder", action="store_true", help="the whole decoder (--model), bucket vs fused form")
    parser.add_argument("--model", type=Path, default=None, help="--decoder's model (default: the bundled SmolLM2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    context = default_context_buckets(args.sequence_length, args.chunk)
    prefill = default_prefill_buckets(args.sequence_length, args.chunk)
    starts = range(0, args.prompt, args.chunk)
    if args.decoder:
        return decoder_main(
            args,
            decoder_forms(args.model or default_model(), args.prompt, args.chunk, context, prefill),
            context,
            prefill,
        )
    forms = {
        "bucket (context buckets)": [bucket_form(s, args.chunk, context) for s in starts],
        "fused (prefill buckets)": [fused_form(s, args.chunk, prefill) for s in starts],
        "lse (prefill buckets)": [lse_form(s, args.chunk, prefill) for s in starts],
    }
    q, k, v = (torch.randn(1, KV_HEADS * GROUPS, args.prompt, DIM) for _ in range(3))
    forms["hf causal sdpa"] = [lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)]
    seconds = {name: 0.0 for name in forms}
    for i in range(len(starts)):  # one chunk of each form after the other: load changes hit every form
        for name, calls in forms.items():
            if i < len(calls):
                seconds[name] += best(calls[i], args.repeats)
    hf = seconds["hf causal sdpa"]
    result = {
        "prompt": args.prompt, "chunk": args.chunk, "sequence_length": args.sequence_length,
        "context_buckets": context, "prefill_buckets": prefill,
        "seconds_per_layer": seconds, "ratio_to_hf": {n: s / hf for n, s in seconds.items()},
    }  # fmt: skip
    lines = [f"Attention of one layer, {args.prompt}-token prompt, chunk {args.chunk}, {args.threads} threads", ""]
    lines += ["| form | s per layer | / HF causal SDPA |", "|---|---:|---:|"]
    lines += [f"| {n} | {s:.3f} | {s / hf:.2f} |" for n, s in seconds.items()]
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"attention-{args.prompt}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"attention-{args.prompt}.md").write_text("\n".join(lines) + "\n")


def decoder_main(args, forms: dict[str, list], context, prefill) -> None:
    seconds = {name: 0.0 for name in forms}
    for i in range(len(next(iter(forms.values())))):
        for name, calls in forms.items():
            seconds[name] += best(calls[i], args.repeats)
    bucket, fused = seconds.values()
    lines = [f"SmolLM2 decoder (eager), {args.prompt}-token prompt, chunk {args.chunk}, {args.threads} threads", ""]
    lines += ["| form | s | / bucket form |", "|---|---:|---:|"]
    lines += [f"| {n} | {s:.2f} | {s / bucket:.2f} |" for n, s in seconds.items()]
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"prompt": args.prompt, "chunk": args.chunk, "context_buckets": context, "prefill_buckets": prefill,
              "seconds": seconds, "ratio_fused_over_bucket": fused / bucket}  # fmt: skip
    (args.out / f"decoder-{args.prompt}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"decoder-{args.prompt}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
