"""Tensor parallelism on the CPU backend: tiny models exported with tp_degree 2, run by 2 gloo ranks.

For each case the same calls (two slots prefilled in chunks, then decoded together) run on the tp 1 export in
this process and on the tp 2 export in 2 spawned ranks: logits within tolerance and greedy tokens identical to
tp 1 and to HF; every rank returns the same results; the ranks' KV cache shards, concatenated (replicated heads
once), equal tp 1's cache; on-device sampling (local top-k, all-gather, global top-k) samples tp 1's tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.references import hf_greedy, hf_last_logits
from support.tensor_parallel import merge_kv_shards, run_ranks
from support.tiny_models import export, quick_first, save_tiny, tiny_model

from optimum_neuron_plugin import NeuronModelForCausalLM
from optimum_neuron_plugin.models.args import ModelArgs
from optimum_neuron_plugin.models.sharding import layout_for

from .helpers import SEEDS, VOCAB, prompt

# The module's one fixture exports every selected case twice (tp 1 and tp 2) before its first test; the quick loop
# (-m "not slow") selects the first case only.
pytestmark = pytest.mark.timeout(2400)

TP = 2
# name -> (architecture, overrides of the tiny shape: 4 query heads over 2 KV heads, VOCAB tokens)
CASES = {
    "llama-sharded-kv": ("llama", {}),  # 2 KV heads over 2 ranks, tied embeddings
    "llama-replicated-kv": ("llama", dict(num_key_value_heads=1)),  # each rank holds the one KV head
    "llama3-odd-vocab": ("llama3", dict(vocab_size=VOCAB + 1)),  # 513 rows: the second slice is padded
    "qwen2": ("qwen2", {}),  # q/k/v biases
    "qwen3": ("qwen3", {}),  # q/k norms, head_dim 32
    "gemma3": ("gemma3", {}),  # sliding window read, (1 + w) and sandwich norms, scaled embeddings, softcapping
    # experts sharded inside each expert, gathered (decode) and dense (chunks); sinks by head; expert biases
    "gpt_oss": ("gpt_oss", {}),
}
SHAPE = dict(batch_size=2, sequence_length=64, prefill_chunk_size=8, prefix_copy=False)
# Only the graphs the scenario calls (and chunk_and_decode, which every chunked export of 2 rows has): every decode
# call reads past position 16 (context bucket 64 only), both kinds decode in 2-row graphs (generate's lone request
# runs in one of their rows), no copy_prefix (tests/cli/test_export_tp.py serves a tp 2 export that has them). Where
# logits are compared, the second prompt's third chunk runs prefill bucket 16 (a prior of exactly 16 positions).
KINDS = {
    "logits": dict(
        SHAPE, on_device_sampling=False, context_buckets=(64,), prefill_buckets=(0, 16, 64), decode_batch_sizes=(2,)
    ),
    "sampling": dict(
        SHAPE, on_device_sampling=True, context_buckets=(64,), prefill_buckets=(0, 64), decode_batch_sizes=(2,)
    ),
}
CASE_PARAMS = quick_first(CASES, quick=("llama-sharded-kv",))
# The TP sampler (local top-k, all-gather, global top-k) runs on the logits, whatever the family: its cases are the
# plain split and the padded vocabulary slice, whose padding columns must never be drawn.
SAMPLING_CASES = ("llama-sharded-kv", "llama3-odd-vocab")
CASE_KIND_PARAMS = [
    pytest.param(case.values[0], kind, marks=case.marks, id=f"{case.id}-{kind}")
    for case in CASE_PARAMS
    for kind in KINDS
    if kind == "logits" or case.values[0] in SAMPLING_CASES
]
PROMPTS = [prompt(13, seed=1), prompt(21, seed=2)]  # 2 chunks, 3 chunks (the second crosses bucket 16)
STEPS = 10
SAMPLED = dict(do_sample=True, top_k=20, top_p=0.9, temperature=0.8, seed=11, max_new_tokens=8, eos_token_id=[])


def scenario(model: NeuronModelForCausalLM) -> dict:
    """Both prompts prefilled (one slot each), then STEPS greedy decode calls of both slots together."""
    result = {"prefill": [], "decode": [], "tokens": [[] for _ in PROMPTS]}
    for slot, tokens in enumerate(PROMPTS):
        logits = model.prefill(slot, tokens)
        result["prefill"].append(logits)
        result["tokens"][slot].append(int(logits.argmax()))
    slots = list(range(len(PROMPTS)))
    for _ in range(STEPS):
        out = result["tokens"]
        positions = [len(PROMPTS[s]) + len(out[s]) - 1 for s in slots]
        step = model.decode(slots, [out[s][-1] for s in slots], positions)
        result["decode"].append(step.logits)
        for s, token in zip(slots, step.tokens, strict=True):
            out[s].append(token)
    result["caches"] = [c.clone() for c in model.caches]
    if model.neuron_config.on_device_sampling:
        result["sampled"] = model.generate(torch.tensor(PROMPTS[:1]), **SAMPLED)[0, len(PROMPTS[0]) :].tolist()
    return result


def rank_worker(rank: int, artifacts: dict[str, Path], out: Path) -> None:
    for key, path in artifacts.items():
        torch.save(scenario(NeuronModelForCausalLM.from_pretrained(path)), out / f"{key}-rank{rank}.pt")


def selected_cases(request) -> list[str]:
    """The cases of this module's tests that the session runs (all, or the quick loop's)."""
    specs = [getattr(item, "callspec", None) for item in request.session.items if item.module is request.module]
    return [case for case in CASES if any(spec is not None and spec.params.get("case") == case for spec in specs)]


def kinds_of(case: str) -> list[str]:
    return [kind for kind in KINDS if kind == "logits" or case in SAMPLING_CASES]


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict:
    """{(case, kind): {"hf", "args", "tp1", "ranks": [rank 0's result, rank 1's]}}: one spawn for every case the
    session runs."""
    root = tmp_path_factory.mktemp("tp")
    artifacts, runs = {}, {}
    for case in selected_cases(request):
        arch, overrides = CASES[case]
        overrides = {"vocab_size": VOCAB, **overrides}
        source = save_tiny(root / "hf" / case, arch, seed=SEEDS[arch], **overrides)
        hf = tiny_model(arch, seed=SEEDS[arch], **overrides)
        for kind in kinds_of(case):
            shape = KINDS[kind]
            tp1 = NeuronModelForCausalLM.from_pretrained(export(source, root / f"{case}-{kind}-tp1", **shape))
            artifacts[f"{case}-{kind}"] = export(source, root / f"{case}-{kind}-tp{TP}", tp_degree=TP, **shape)
            runs[case, kind] = {"hf": hf, "args": tp1.args, "tp1": scenario(tp1)}
    run_ranks(rank_worker, TP, artifacts, root, start_method="fork")
    for (case, kind), run in runs.items():
        run["ranks"] = [torch.load(root / f"{case}-{kind}-rank{r}.pt") for r in range(TP)]
    return runs


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_logits_match_tp1_and_hf(runs, case):
    run = runs[case, "logits"]
    tp1, tp2 = run["tp1"], run["ranks"][0]
    for slot, tokens in enumerate(PROMPTS):
        torch.testing.assert_close(tp2["prefill"][slot], tp1["prefill"][slot], atol=1e-4, rtol=0)
        torch.testing.assert_close(tp2["prefill"][slot], hf_last_logits(run["hf"], tokens), atol=1e-3, rtol=0)
    torch.testing.assert_close(torch.stack(tp2["decode"]), torch.stack(tp1["decode"]), atol=1e-4, rtol=0)


@pytest.mark.parametrize(("case", "kind"), CASE_KIND_PARAMS)
def test_greedy_tokens_match_tp1_and_hf(runs, case, kind):
    """Host argmax of all-gathered logits ("logits") and the on-device TP sampler at top_k 1 ("sampling")."""
    run = runs[case, kind]
    assert run["ranks"][0]["tokens"] == run["tp1"]["tokens"]
    for slot, tokens in enumerate(PROMPTS):
        assert run["ranks"][0]["tokens"][slot] == hf_greedy(run["hf"], tokens, STEPS + 1)


@pytest.mark.parametrize(("case", "kind"), CASE_KIND_PARAMS)
def test_every_rank_returns_the_same_results(runs, case, kind):
    first, second = runs[case, kind]["ranks"]
    assert first["tokens"] == second["tokens"]
    assert all(torch.equal(a, b) for a, b in zip(first["prefill"], second["prefill"], strict=True))
    assert first.get("sampled") == second.get("sampled")


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_kv_shards_concatenate_to_the_tp1_cache(runs, case):
    run = runs[case, "logits"]
    args: ModelArgs = run["args"]
    layout = layout_for(args, TP)
    shards = [rank["caches"] for rank in run["ranks"]]
    for layer, full in enumerate(run["tp1"]["caches"]):
        parts = [s[layer] for s in shards]
        assert all(p.shape[2] == layout.kv_heads for p in parts)
        torch.testing.assert_close(merge_kv_shards(parts, layout.kv_replicas), full, atol=1e-5, rtol=0)
    if layout.kv_replicas > 1:  # ranks sharing a KV head hold the same values
        assert all(torch.equal(a, b) for a, b in zip(*shards, strict=True))


@pytest.mark.parametrize("case", [c for c in CASE_PARAMS if c.values[0] in SAMPLING_CASES])
def test_on_device_sampling_samples_tp1_tokens(runs, case):
    """Same seed: the global top-k over the ranks' top-k is tp 1's top-k, and every rank draws rank 0's uniform."""
    run = runs[case, "sampling"]
    assert run["ranks"][0]["sampled"] == run["tp1"]["sampled"]
