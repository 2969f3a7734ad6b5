"""logit_bias and min_p on device: the decode graphs add each row's (token id, bias) pairs to the logits and drop the
tokens min_p rules out before top-k / top-p, while the logprobs stay the raw logits' (vLLM's raw_logprobs).

References: vLLM's own LogitBiasLogitsProcessor, MinPLogitsProcessor and apply_top_k_top_p (vllm/v1/sample), applied
to random logits and to HF's logits of the same sequences.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from support.references import hf_last_logits

from optimum_neuron_plugin.errors import InputError
from optimum_neuron_plugin.models.sampling import sampler_candidates, sorted_probs
from optimum_neuron_plugin.sampling import SamplingParams, make_generator, params_tensor, sample_on_host

from .helpers import CHUNK, CHUNKED, VOCAB, prompt
from .test_device_logprobs import assert_vllm_logprobs, prefilled


def vllm_processed(logits: torch.Tensor, sampling: list[SamplingParams]) -> torch.Tensor:
    """logits [n, V] through vLLM's logit_bias processor, then temperature and its min_p processor (-inf where
    dropped), as vLLM's Sampler orders them; greedy rows get no min_p (argmax-invariant processors are skipped)."""
    from vllm.sampling_params import SamplingParams as VllmParams
    from vllm.v1.sample.logits_processor import BatchUpdate
    from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinPLogitsProcessor

    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=len(sampling)))
    bias, min_p = LogitBiasLogitsProcessor(None, "cpu", False), MinPLogitsProcessor(config, "cpu", False)
    added = [
        (i, VllmParams(logit_bias=dict(s.logit_bias) or None, min_p=0.0 if s.greedy else s.min_p), None, [])
        for i, s in enumerate(sampling)
    ]
    for processor in (bias, min_p):
        processor.update_state(BatchUpdate(len(sampling), [], added, []))
    biased = bias.apply(logits.clone())
    temperature = torch.tensor([[1.0 if s.greedy else s.temperature] for s in sampling])
    dropped = torch.isneginf(min_p.apply(biased / temperature))
    return biased.masked_fill(dropped, float("-inf"))


def vllm_distribution(logits: torch.Tensor, sampling: list[SamplingParams]) -> torch.Tensor:
    """vLLM's sampling distribution [n, V]: processed logits, temperature, top-k / top-p, softmax."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    temperature = torch.tensor([[s.temperature] for s in sampling])
    k = torch.tensor([s.top_k if s.top_k > 0 else logits.shape[-1] for s in sampling])
    p = torch.tensor([s.top_p for s in sampling])
    return apply_top_k_top_p(vllm_processed(logits, sampling) / temperature, k, p).softmax(-1)


def random_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def bias_inputs(sampling: list[SamplingParams], slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, values = torch.zeros(len(sampling), slots, dtype=torch.int32), torch.zeros(len(sampling), slots)
    for row, params in enumerate(sampling):
        for slot, (token, bias) in enumerate(params.logit_bias):
            ids[row, slot], values[row, slot] = token, bias
    return ids, values


ROWS = [
    SamplingParams(top_k=0, temperature=1.5, logit_bias=((3, 5.0), (999, -100.0), (0, 2.5))),
    SamplingParams(top_k=0, temperature=0.7, min_p=0.05),
    SamplingParams(top_k=40, top_p=0.8, temperature=1.2, min_p=0.02, logit_bias=((7, 4.0), (8, -3.0))),
    SamplingParams(top_k=0, temperature=2.0, min_p=1.0),  # only the most likely token
    SamplingParams(),  # greedy: min_p has no say, the bias does
]


def test_the_sampler_candidates_are_the_top_k_of_vllms_biased_logits():
    """One top-k of the raw logits (max_topk + M candidates) and the gathered biased ids give exactly the top max_topk
    of vLLM's processed logits: a token raised from the bottom, the raw top sunk under the next M, duplicate unused
    slots (0, 0.0) next to a real bias on token 0, and each candidate's raw logit alongside."""
    logits = random_logits(4, 1000, seed=1)
    order = logits.argsort(dim=-1, descending=True)
    sunk = tuple((int(t), -50.0) for t in order[3, :4])  # all 4 slots: the next 4 raw candidates fill in
    sampling = [
        *ROWS[:3],
        SamplingParams(logit_bias=sunk),
        SamplingParams(logit_bias=((0, 30.0), (int(order[0, -1]), 40.0), (int(order[0, 3]), -1.0))),
    ]
    logits = torch.cat((logits, logits[:1]))
    expected = vllm_processed(logits, [SamplingParams(logit_bias=s.logit_bias) for s in sampling])
    for max_topk in (8, 1000):
        got = sampler_candidates(logits, max_topk, bias_inputs(sampling, 4))
        values, ids = expected.topk(max_topk)
        assert torch.equal(got.ids, ids) and torch.equal(got.values, values)
        assert torch.equal(got.raw, logits.gather(-1, ids))
    assert got.ids[4, :2].tolist() == [int(order[0, -1]), 0]
    assert set(got.ids[3, :8].tolist()) == set(order[3, 4:12].tolist())


def test_the_sampler_draws_from_vllms_distribution_with_min_p_and_bias():
    """The probabilities the sampler draws from (candidates sorted by biased logit, then temperature, min_p, top-k,
    top-p) equal vLLM's, over the whole vocabulary (on device the candidates are the top max_topk)."""
    logits = random_logits(len(ROWS) - 1, 1000, seed=2)
    sampling = ROWS[:-1]
    candidates = sampler_candidates(logits, 1000, bias_inputs(sampling, 4))
    probs = sorted_probs(candidates.values, params_tensor(sampling, 1000), lambda p: p.cumsum(-1))
    got = torch.zeros_like(logits).scatter(-1, candidates.ids, probs / probs.sum(-1, keepdim=True))
    expected = vllm_distribution(logits, sampling)
    assert torch.allclose(got, expected, atol=1e-5)
    support = (expected > 0).sum(-1).tolist()
    assert support[3] == 1 and support[1] < 1000 and support[2] <= 40


@pytest.fixture(scope="module")
def chunked(zoo):
    return zoo.artifact("llama", **CHUNKED)


def hf_rows(hf, sequences: list[list[int]]) -> torch.Tensor:
    return torch.stack([hf_last_logits(hf, s) for s in sequences])


@pytest.mark.parametrize("rows", [1, 3], ids=["one-row graph", "batch graph"])
def test_greedy_decode_is_the_argmax_of_biased_hf_logits_with_raw_logprobs(chunked, rows):
    model, hf = chunked.model, chunked.hf
    sequences, firsts = prefilled(model, [5, 11, 20][:rows])
    logits = hf_rows(hf, sequences)
    # Row 0 lifts its 6th most likely token over the rest; row 1 sinks its top token; row 2 has no bias.
    lifted, top = int(logits[0].argsort(descending=True)[5]), int(logits[1 % rows].argmax())
    sampling = [SamplingParams(logit_bias=((lifted, 30.0), (1, -2.0))), SamplingParams(logit_bias=((top, -100.0),))]
    sampling = (sampling + [SamplingParams()])[:rows]
    result = model.decode(list(range(rows)), firsts, [len(s) - 1 for s in sequences], sampling)
    assert result.tokens == vllm_processed(logits, sampling).argmax(-1).tolist()
    assert result.tokens[0] == lifted and (rows == 1 or result.tokens[1] != top)
    assert_vllm_logprobs(result, hf, sequences, 20)  # the raw distribution's: rank 6 for row 0
    assert result.logprobs.ranks[0] == 6


def test_sampled_decode_draws_what_vllms_processing_of_hf_logits_leaves(chunked):
    """Hot sampling with min_p and logit_bias: each draw equals the plugin's draw (same uniforms) from HF's logits
    processed by vLLM's own logit_bias and min_p processors, and stays inside their support."""
    model, hf = chunked.model, chunked.hf
    sequences, firsts = prefilled(model, [6, 9, 14])
    logits = hf_rows(hf, sequences)
    sampling = [
        SamplingParams(top_k=0, temperature=2.0, min_p=0.2),
        SamplingParams(top_k=0, temperature=3.0, logit_bias=((int(logits[1].argmin()), 12.0),)),
        SamplingParams(top_k=20, top_p=0.9, temperature=1.5, min_p=0.05, logit_bias=((4, 3.0), (5, -3.0))),
    ]
    processed = vllm_processed(logits, sampling)
    plain = [SamplingParams(s.top_k, s.top_p, s.temperature) for s in sampling]
    device_gens, host_gens = [make_generator(s) for s in (1, 2, 3)], [make_generator(s) for s in (1, 2, 3)]
    positions = [len(s) - 1 for s in sequences]
    drawn = set()
    for _ in range(8):
        result = model.decode([0, 1, 2], firsts, positions, sampling, device_gens)
        assert result.tokens == sample_on_host(processed, plain, host_gens, 256).tolist()
        assert all(torch.isfinite(processed[row, token]) for row, token in enumerate(result.tokens))
        assert_vllm_logprobs(result, hf, sequences, 20)
        drawn |= {(row, token) for row, token in enumerate(result.tokens)}
    assert len(drawn) > 3  # the draws vary


def test_chunk_and_decode_applies_its_decode_rows_bias(chunked):
    model, hf = chunked.model, chunked.hf
    sequences, firsts = prefilled(model, [6, 9])
    logits = hf_rows(hf, sequences)
    lifted = int(logits[1].argsort(descending=True)[3])
    sampling = [SamplingParams(), SamplingParams(logit_bias=((lifted, 25.0),))]
    chunk = prompt(CHUNK, seed=97)
    positions = [len(s) - 1 for s in sequences]
    chunk_logits, result = model.prefill_and_decode(2, chunk, 0, [0, 1], firsts, positions, sampling)
    assert result.tokens == [int(logits[0].argmax()), lifted]
    assert_vllm_logprobs(result, hf, sequences, 20)
    assert torch.allclose(chunk_logits, hf_last_logits(hf, chunk), atol=1e-4)


def test_more_pairs_than_compiled_or_ids_outside_the_vocabulary_are_refused(chunked):
    model = chunked.model
    assert model.neuron_config.max_logit_bias == 32
    too_many = SamplingParams(logit_bias=tuple((t, 1.0) for t in range(33)))
    with pytest.raises(InputError, match=r"logit_bias has 33 entries .* at most 32 per sequence \(max_logit_bias\)"):
        model.decode([0], [1], [0], [too_many])
    with pytest.raises(InputError, match=rf"token ids \[{VOCAB}\] are outside the vocabulary \[0, {VOCAB}\)"):
        model.decode([0], [1], [0], [SamplingParams(logit_bias=((VOCAB, 1.0),))])
