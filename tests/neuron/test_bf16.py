"""bf16, the neuron backend's default dtype, on the CPU backend: exported, saved, loaded, greedy tokens compared
with Hugging Face transformers run in bf16. And the same comparison on a Neuron device (skipped without one)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from support.references import hf_greedy
from support.tiny_models import quick_first

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.backends.neuron import neuron_core_count
from tests.core.helpers import prompt

from .conftest import ARCHITECTURES, MOE_ARCHITECTURES

SHAPE = dict(batch_size=2, sequence_length=64, prefill_chunk_size=8, torch_dtype="bfloat16")
NEW_TOKENS = 24
PROMPTS = [prompt(11, seed) for seed in (1, 2, 3)]
# The CPU artifacts: one context bucket, two prefill buckets and no copy_prefix (5 graphs instead of 19): the prompts'
# second chunk reads a padded prior context, the decode steps one bucket (the buckets' arithmetic and the prefix copy
# are dtype-free: tests/core).
ONE_BUCKET = dict(context_buckets=(64,), prefill_buckets=(0, 64), prefix_copy=False)
TIE_ULPS = 2  # bf16 rounding of two computations of the same logit differs by a unit or two in the last place


def bf16_ulp(value: float) -> float:
    """The spacing of bf16 numbers at `value` (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(max(abs(value), 2.0**-126))) - 7)


def agreement(model: NeuronModelForCausalLM, hf: torch.nn.Module) -> list[int]:
    """Per prompt, how many leading greedy tokens equal the reference's. Where they part, it must be a bf16
    near-tie: our token's logit in the reference is within TIE_ULPS bf16 units of the reference's best."""
    counts = []
    for tokens in PROMPTS:
        ours = model.generate(torch.tensor([tokens]), max_new_tokens=NEW_TOKENS, eos_token_id=[])[0, len(tokens) :]
        ours, theirs = ours.tolist(), hf_greedy(hf, tokens, NEW_TOKENS)
        parted = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), NEW_TOKENS)
        if parted < NEW_TOKENS:
            with torch.no_grad():
                logits = hf(torch.tensor([tokens + theirs[:parted]])).logits[0, -1].float()
            best = float(logits.max())
            gap = best - float(logits[ours[parted]])
            assert gap <= TIE_ULPS * bf16_ulp(best), (
                f"token {parted}: ours {ours[parted]} is {gap} below the reference's best logit {best}, not a near-tie"
            )
        counts.append(parted)
    return counts


@pytest.mark.parametrize("name", quick_first(ARCHITECTURES + MOE_ARCHITECTURES))
def test_bf16_cpu_artifact_greedy_matches_transformers_in_bf16(tiny_models, tmp_path, name):
    hf = tiny_models[name].hf
    hf.save_pretrained(tmp_path / "hf")
    exported = NeuronModelForCausalLM.export(
        tmp_path / "hf", NeuronConfig(cpu_compiler="export", **SHAPE, **ONE_BUCKET)
    )
    exported.save_pretrained(tmp_path / "artifact")
    model = NeuronModelForCausalLM.from_pretrained(tmp_path / "artifact")
    assert model.params["model.norm.weight"].dtype == torch.bfloat16
    counts = agreement(model, copy.deepcopy(hf).to(torch.bfloat16))
    print(f"{name}: leading greedy tokens equal to transformers bf16: {counts} of {NEW_TOKENS}")
    # bf16 rounds differently here (other op order) than in transformers: a near-tie between two logits (even an
    # exact tie in bf16, broken by index) can flip a token, and the sequences part from there. agreement() asserts
    # that every token before the parting is equal and that the parting is such a tie.


@pytest.mark.skipif(neuron_core_count() == 0, reason="needs a trn2/trn3 host with torch-neuronx (Neuron SDK 2.33+)")
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_neuron_device_greedy_matches_transformers_in_bf16(tiny_models, tmp_path, name):
    hf = tiny_models[name].hf
    hf.save_pretrained(tmp_path / "hf")
    exported = NeuronModelForCausalLM.export(tmp_path / "hf", NeuronConfig(backend="neuron", **SHAPE))
    exported.save_pretrained(tmp_path / "artifact")
    model = NeuronModelForCausalLM.from_pretrained(tmp_path / "artifact")
    agreement(model, copy.deepcopy(hf).to(torch.bfloat16))
