"""On-device sampling (models.sampling.sample, the token_generation graph) and the host sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optimum_neuron_plugin.models.sampling import sample
from optimum_neuron_plugin.sampling import SamplingParams, make_generator, sample_on_host

from .helpers import prompt

DRAWS = 20_000
# Fixed logits over 10 tokens, deliberately not sorted.
LOGITS = torch.tensor([1.0, 3.0, 0.5, 2.2, -1.0, 2.9, 0.0, 1.7, -0.5, 2.5])
# 99.9% quantiles of the chi-square distribution by degrees of freedom.
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88}


def expected_distribution(logits: torch.Tensor, top_k: int, top_p: float, temperature: float) -> np.ndarray:
    """Reference in float64, written independently of the sampler: temperature, then top-k, then top-p
    (keep the most likely tokens while the mass before them is below top_p), renormalised."""
    values = logits.double().numpy() / temperature
    order = np.argsort(-values, kind="stable")
    kept = order[:top_k]
    probs = np.exp(values[kept] - values[kept].max())
    probs /= probs.sum()
    before = np.cumsum(probs) - probs
    kept, probs = kept[before < top_p], probs[before < top_p]
    out = np.zeros(len(values))
    out[kept] = probs / probs.sum()
    return out


def assert_matches(tokens: torch.Tensor, expected: np.ndarray) -> None:
    counts = np.bincount(tokens.numpy(), minlength=len(expected))
    assert counts[expected == 0].sum() == 0, f"sampled excluded tokens: {counts} vs {expected}"
    freq = counts / counts.sum()
    total_variation = 0.5 * np.abs(freq - expected).sum()
    assert total_variation < 0.015, f"total variation {total_variation:.4f}: {freq.round(4)} vs {expected.round(4)}"
    support = expected > 0
    if support.sum() > 1:
        n = counts.sum()
        chi2 = (((counts - n * expected) ** 2)[support] / (n * expected[support])).sum()
        assert chi2 < CHI2_999[int(support.sum()) - 1], f"chi-square {chi2:.1f}: {freq.round(4)} vs {expected.round(4)}"


CASES = {
    "plain": (10, 1.0, 1.0),
    "top_k": (4, 1.0, 1.0),
    "top_p": (10, 0.7, 1.0),
    "cold": (10, 1.0, 0.5),
    "hot": (10, 1.0, 2.5),
    "all_three": (5, 0.8, 1.5),
    "top_p_tiny": (10, 0.05, 1.0),  # only the most likely token survives
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_sample_frequencies_match_the_distribution(case):
    top_k, top_p, temperature = case
    uniform = torch.rand(DRAWS, 1, generator=torch.Generator().manual_seed(1234))
    params = torch.tensor([[float(top_k), top_p, temperature, 0.0]]).repeat(DRAWS, 1)
    tokens = sample(LOGITS.repeat(DRAWS, 1), params, uniform, max_topk=10)
    assert_matches(tokens, expected_distribution(LOGITS, top_k, top_p, temperature))


def test_top_k_is_capped_at_max_topk():
    uniform = torch.rand(DRAWS, 1, generator=torch.Generator().manual_seed(5))
    params = torch.tensor([[8.0, 1.0, 1.0, 0.0]]).repeat(DRAWS, 1)
    tokens = sample(LOGITS.repeat(DRAWS, 1), params, uniform, max_topk=3)
    assert_matches(tokens, expected_distribution(LOGITS, 3, 1.0, 1.0))


def test_host_sampler_frequencies_match_the_distribution():
    """sample_on_host with a request's generator; top_k <= 0 means the whole vocabulary."""
    generator = make_generator(99)
    params = SamplingParams(top_k=0, top_p=0.9, temperature=1.3)
    tokens = sample_on_host(LOGITS.repeat(DRAWS, 1), [params] * DRAWS, [generator] * DRAWS)
    assert_matches(tokens, expected_distribution(LOGITS, 10, 0.9, 1.3))


def test_greedy_is_argmax():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(256, 1000, generator=generator) * 3
    uniform = torch.rand(256, 1, generator=generator)
    uniform[:8] = 1 - 1e-7  # extreme draws must not matter
    greedy = torch.tensor([[1.0, 1.0, 1.0, 0.0]]).repeat(256, 1)
    assert torch.equal(sample(logits, greedy, uniform, max_topk=256), logits.argmax(-1))
    assert torch.equal(sample_on_host(logits, [SamplingParams()] * 256, [None] * 256), logits.argmax(-1))


@pytest.mark.parametrize("temperature", [0.01, 0.5, 1.0, 3.0, 100.0])
def test_top_k_one_is_greedy_at_any_temperature(temperature):
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(256, 1000, generator=generator) * 3
    uniform = torch.rand(256, 1, generator=generator)
    uniform[:8] = 1 - 1e-7
    params = torch.tensor([[1.0, 0.9, temperature, 0.0]]).repeat(256, 1)
    assert torch.equal(sample(logits, params, uniform, max_topk=64), logits.argmax(-1))


# ---- through the token_generation graph ---------------------------------------------------------


def prefill_three(model, seed):
    prompts = [prompt(5 + 4 * s, seed=seed + s) for s in range(3)]
    return [int(model.prefill(s, p).argmax()) for s, p in enumerate(prompts)], [len(p) for p in prompts]


def test_graph_greedy_and_top_k_one_are_argmax(llama_context, llama_logits):
    """The on-device sampling graph (llama_context) against the logits of the same model (llama_logits)."""
    seq_ids = [2, 0, 1]
    first, lengths = prefill_three(llama_context.model, seed=70)
    assert prefill_three(llama_logits.model, seed=70) == (first, lengths)
    args = (seq_ids, [first[s] for s in seq_ids], [lengths[s] for s in seq_ids])
    argmax = llama_logits.model.decode(*args).logits.argmax(-1).tolist()
    assert llama_context.model.decode(*args).tokens == argmax
    for temperature in (0.2, 1.0, 5.0):
        sampling = [SamplingParams(top_k=1, top_p=0.5, temperature=temperature)] * 3
        generators = [make_generator(seed) for seed in range(3)]
        assert llama_context.model.decode(*args, sampling=sampling, generators=generators).tokens == argmax


@pytest.mark.parametrize(
    "params",
    [SamplingParams(top_k=50, top_p=0.9, temperature=0.8), SamplingParams(top_k=5, top_p=1.0, temperature=1.5)],
    ids=["top_k50_top_p0.9_t0.8", "top_k5_t1.5"],
)
def test_graph_and_host_sampler_agree_for_the_same_draws(llama_context, llama_logits, params):
    """Same model and state, same uniform draws (same generator seeds): the token_generation graph's sampler
    (llama_context) and sample_on_host over the logits graph's output (llama_logits) pick the same tokens."""
    seq_ids = [1, 2, 0]
    first, lengths = prefill_three(llama_context.model, seed=80)
    assert prefill_three(llama_logits.model, seed=80) == (first, lengths)
    args = (seq_ids, [first[s] for s in seq_ids], [lengths[s] for s in seq_ids], [params] * 3)
    on_device, on_host = [], []
    for draw in range(20):  # the same decode step, redone with fresh draws (rewrites the same K/V)
        on_device += llama_context.model.decode(*args, [make_generator(100 * draw + i) for i in range(3)]).tokens
        on_host += llama_logits.model.decode(*args, [make_generator(100 * draw + i) for i in range(3)]).tokens
    assert on_device == on_host
    assert len(set(on_device)) > 3  # really sampled, not greedy


def test_same_seed_same_tokens(llama_context, llama_logits):
    ids = torch.tensor([prompt(9, seed=90), prompt(9, seed=91)])
    kwargs = dict(max_new_tokens=12, do_sample=True, top_k=50, top_p=0.95, temperature=1.2, eos_token_id=[])
    first = llama_context.model.generate(ids, seed=1234, **kwargs)
    assert torch.equal(first, llama_context.model.generate(ids, seed=1234, **kwargs))
    # Sampling on the host from the logits gives the same tokens for the same seed.
    assert torch.equal(first, llama_logits.model.generate(ids, seed=1234, **kwargs))
    assert not torch.equal(first, llama_context.model.generate(ids, seed=1235, **kwargs))
    greedy = llama_context.model.generate(ids, max_new_tokens=12, eos_token_id=[])
    assert not torch.equal(first, greedy)


HOST_SAMPLING_UNDER_A_MEMORY_LIMIT = """
import json, resource, re
import torch
from optimum_neuron_plugin.sampling import SamplingParams, make_generator, sample_on_host

used = int(re.search(r"VmData:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
limit = used + (1 << 30)  # 1 GiB above what the process already holds
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
logits = torch.randn(2, 49152)  # SmolLM2's vocabulary
params = [SamplingParams(top_k=0, top_p=0.9, temperature=1.0)] * 2  # no top-k limit: the whole vocabulary
print(json.dumps(sample_on_host(logits, params, [make_generator(0), make_generator(1)]).tolist()))
"""


def test_host_sampler_over_a_whole_vocabulary_needs_no_vocab_squared_memory():
    """Without on-device sampling the host samples over the whole vocabulary: its running sums must not build the
    graphs' k x k triangular matrix (9.7 GB for 49152 tokens). Run under a 1 GiB allowance in a child process."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", HOST_SAMPLING_UNDER_A_MEMORY_LIMIT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tokens = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(tokens) == 2 and all(0 <= t < 49152 for t in tokens)
