"""Sampling through vLLM's engine and the graphs: what temperature, top_k and top_p say, measured.

A tiny Llama with a 32-token vocabulary (no tokenizer: vLLM runs with skip_tokenizer_init) is exported with
on-device sampling and max_topk 6 < 32. Each case sends many seeded requests through vllm.LLM:
- host: the first token of every request, sampled on the host from the prefill logits (most requests
  have max_tokens=1: a prefill is all they cost);
- device: tokens 2..17 of longer requests, sampled on the device by token_generation.
Each sampled token is compared with the distribution computed from Hugging Face's logits for the context
it was drawn in (support/distributions.py: temperature, top-k capped at max_topk, top-p).

False failures: each of the 8 comparisons fails a correct sampler with probability below 1e-7 (a
distribution-free L1 bound, not an asymptotic chi-square), so the module below 1e-6; the seeds are fixed,
so a run is reproducible. Power: each case also checks that a sampler ignoring one of its parameters (or,
for top_k=-1, the max_topk cap) fails its comparison with probability above 0.999.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support.distributions import Params, compare, detects
from support.references import hf_greedy, hf_next_logits
from support.tiny_models import build_atomically, export, tiny_model

pytestmark = pytest.mark.slow  # an in-process vLLM engine

VOCAB = 32
MAX_TOPK = 6  # below the vocabulary: top_k=-1 means "at most 6 tokens" on the device, and so on the host
BATCH_SIZE = 32  # draws per engine step
PROMPT_LENGTH = 4
PROMPTS = [[3, 17, 9, 25], [30, 1, 12, 7], [5, 5, 21, 14], [8, 28, 2, 19]]
HOST_REQUESTS = 1600  # max_tokens=1
DEVICE_REQUESTS = 200
DEVICE_TOKENS = 17  # 1 host + 16 device draws per request
FAILURE = 1e-7  # per comparison: 8 comparisons, below 1e-6 for the module
LOGIT_SCALE = 4.0  # lm_head scaled up: peaked enough for temperature to matter, flat enough for top-k

# case -> (parameters, parameters it is not expected to be sensitive to)
CASES = {
    "temperature": (Params(temperature=0.7), ()),
    "top_k": (Params(top_k=5), ()),
    "top_p": (Params(top_p=0.8), ()),
    # At T=0.7 the 0.8 nucleus rarely holds 5 tokens: top_k is the "top_k" case's to check.
    "all_three": (Params(temperature=0.7, top_k=5, top_p=0.8), ("top_k",)),
}
NEUTRAL = Params()


@pytest.fixture(scope="module")
def tiny_hf():
    model = tiny_model("llama", seed=5, vocab_size=VOCAB, tie_word_embeddings=False)
    with torch.no_grad():
        # LOGIT_SCALE and the power checks were tuned on unit norm weights (tiny_model randomises them).
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
        model.lm_head.weight.mul_(LOGIT_SCALE)
    return model


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, tiny_hf) -> Path:
    root = tmp_path_factory.mktemp("sampling")
    source = build_atomically(root / "hf", tiny_hf.save_pretrained)
    config = dict(batch_size=BATCH_SIZE, sequence_length=32, prefill_chunk_size=8, max_topk=MAX_TOPK)
    return export(source, root / "artifact", on_device_sampling=True, **config)


@pytest.fixture(scope="module")
def llm(artifact):
    from vllm import LLM

    engine = LLM(model=str(artifact), seed=0, skip_tokenizer_init=True)
    yield engine
    engine.llm_engine.engine_core.shutdown()


def vllm_params(params: Params, seed: int | None, max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=seed,
        ignore_eos=True,
        detokenize=False,
    )


def generate(llm, prompts: list[list[int]], params: list) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@dataclass
class Draws:
    """Sampled tokens [n] with the HF logits [n, V] of the context each was drawn in."""

    host_logits: torch.Tensor
    host_tokens: torch.Tensor
    device_logits: torch.Tensor
    device_tokens: torch.Tensor


def sample_case(llm, tiny_hf, params: Params, first_seed: int) -> Draws:
    host_logits, host_tokens = [], []
    for requests, max_tokens in ((HOST_REQUESTS, 1), (DEVICE_REQUESTS, DEVICE_TOKENS)):
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]
        seeds = range(first_seed, first_seed + requests)
        first_seed += requests
        outputs = generate(llm, prompts, [vllm_params(params, seed, max_tokens) for seed in seeds])
        sequences = [p + o for p, o in zip(prompts, outputs, strict=True)]
        logits = hf_next_logits(tiny_hf, sequences)[:, PROMPT_LENGTH - 1 : -1]
        tokens = torch.tensor(outputs)
        host_logits.append(logits[:, 0])
        host_tokens.append(tokens[:, 0])
    device_logits, device_tokens = logits[:, 1:].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
    return Draws(torch.cat(host_logits), torch.cat(host_tokens), device_logits, device_tokens)


@pytest.fixture(scope="module")
def case_draws(llm, tiny_hf):
    """Each case's draws, sampled once for its host and device tests."""
    cache: dict[str, Draws] = {}

    def get(case: str) -> Draws:
        if case not in cache:
            cache[case] = sample_case(llm, tiny_hf, CASES[case][0], 100_000 * list(CASES).index(case))
        return cache[case]

    return get


def ignoring_one(params: Params) -> dict[str, tuple[Params, int | None]]:
    """Samplers that ignore one of the parameters this case sets (or the max_topk cap when top_k is unset)."""
    alternatives = {
        field.name: (dataclasses.replace(params, **{field.name: getattr(NEUTRAL, field.name)}), MAX_TOPK)
        for field in dataclasses.fields(Params)
        if getattr(params, field.name) != getattr(NEUTRAL, field.name)
    }
    if params.top_k <= 0:
        alternatives["max_topk"] = (params, None)
    return alternatives


@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("case", CASES)
def test_sampled_tokens_follow_the_parameters(case_draws, case, where):
    params, insensitive = CASES[case]
    draws = case_draws(case)
    logits, tokens = (
        (draws.host_logits, draws.host_tokens) if where == "host" else (draws.device_logits, draws.device_tokens)
    )
    verdict = compare(logits, tokens, params, MAX_TOPK, FAILURE)
    assert verdict.draws > 0.9 * len(tokens), f"too many ambiguous contexts: {verdict.explain()}"
    assert verdict.outside == 0 and verdict.l1 < verdict.bound, verdict.explain()
    for name, (alternative, cap) in ignoring_one(params).items():
        if name not in insensitive:
            assert detects(logits, params, MAX_TOPK, alternative, cap, FAILURE), f"blind to {name}"


def test_top_k_one_is_greedy(llm, tiny_hf):
    greedy = generate(llm, PROMPTS, [vllm_params(Params(temperature=0.0), None, 8)] * len(PROMPTS))
    top_k_one = generate(llm, PROMPTS, [vllm_params(Params(top_k=1), seed, 8) for seed in range(len(PROMPTS))])
    assert top_k_one == greedy == [hf_greedy(tiny_hf, p, 8) for p in PROMPTS]


def test_a_seeded_request_ignores_its_batch_neighbours(llm):
    seeded = vllm_params(Params(temperature=1.3, top_p=0.95), 77, 12)
    alone = generate(llm, [PROMPTS[0]], [seeded])[0]
    # Seven neighbours (seeded and not, sampled and greedy), the seeded request in the middle of the batch.
    neighbours = [vllm_params(Params(temperature=1.0), seed, 12) for seed in (None, 3, None)]
    neighbours += [vllm_params(Params(temperature=0.0), None, 12 - i) for i in range(4)]
    prompts = [PROMPTS[(i + 1) % len(PROMPTS)] for i in range(7)]
    together = generate(llm, [*prompts[:3], PROMPTS[0], *prompts[3:]], [*neighbours[:3], seeded, *neighbours[3:]])
    assert together[3] == alone
    again = generate(llm, [PROMPTS[0]] * 2, [vllm_params(Params(temperature=1.3, top_p=0.95), s, 12) for s in (78, 79)])
    assert alone not in again  # the seed matters
