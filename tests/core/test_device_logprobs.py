"""Logprobs from the device sampler: token_generation and chunk_and_decode return, next to each sampled token, vLLM's
raw logprobs (log-softmax of the model's logits) of that token and of the top max_logprobs, and the token's rank.

Reference: HF's logits of the same sequences, log-softmaxed in fp32, and vLLM's rank rule (tokens whose logprob is at
least the sampled token's).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.references import hf_last_logits
from support.tensor_parallel import run_ranks

from optimum_neuron_plugin.config import NeuronConfig, NeuronConfigError
from optimum_neuron_plugin.models.collectives import Collectives
from optimum_neuron_plugin.models.sampling import sample_with_logprobs
from optimum_neuron_plugin.sampling import SamplingParams, make_generator

from .helpers import CHUNK, CHUNKED, prompt

HOT = SamplingParams(top_k=0, top_p=1.0, temperature=3.0)
ATOL = 1e-4


@pytest.fixture(scope="module")
def chunked(zoo):
    return zoo.artifact("llama", **CHUNKED)


def prefilled(model, lengths: list[int]) -> tuple[list[list[int]], list[int]]:
    prompts = [prompt(n, seed=60 + i) for i, n in enumerate(lengths)]
    firsts = [int(model.prefill(slot, p).argmax()) for slot, p in enumerate(prompts)]
    return [p + [t] for p, t in zip(prompts, firsts, strict=True)], firsts


def assert_vllm_logprobs(result, hf, sequences: list[list[int]], top: int) -> None:
    """Row i: the sampled token's logprob and rank, then the top `top` ids in decreasing order, as vLLM computes
    them from HF's logits."""
    expected = torch.stack([hf_last_logits(hf, s) for s in sequences]).log_softmax(-1, dtype=torch.float32)
    got = result.logprobs
    assert got.token_ids.dtype == got.ranks.dtype == torch.int32 and got.logprobs.dtype == torch.float32
    assert tuple(got.token_ids.shape) == tuple(got.logprobs.shape) == (len(sequences), 1 + top)
    for row, token in enumerate(result.tokens):
        assert got.token_ids[row, 0] == token
        assert got.logprobs[row, 0] == pytest.approx(float(expected[row, token]), abs=ATOL)
        assert got.ranks[row] == int((expected[row] >= expected[row, token]).sum())
        values, ids = expected[row].topk(top)
        assert got.token_ids[row, 1:].tolist() == ids.tolist()
        assert torch.allclose(got.logprobs[row, 1:], values, atol=ATOL)


@pytest.mark.parametrize("rows", [1, 3], ids=["one-row graph", "batch graph"])
def test_decode_returns_hf_log_softmax_of_greedy_and_sampled_tokens(chunked, rows):
    model, hf = chunked.model, chunked.hf
    assert model.neuron_config.max_logprobs == 20
    sequences, firsts = prefilled(model, [5, 11, 20][:rows])
    positions = [len(s) - 1 for s in sequences]
    greedy = model.decode(list(range(rows)), firsts, positions)
    assert_vllm_logprobs(greedy, hf, sequences, 20)
    assert greedy.logprobs.ranks.tolist() == [1] * rows  # greedy draws the most likely token
    # Hot sampling draws unlikely tokens: their logprob and rank are still the raw distribution's.
    generators = [make_generator(seed) for seed in range(rows)]
    ranks = set()
    for _ in range(6):  # the same step again: K/V rewritten in place, new draws
        result = model.decode(list(range(rows)), firsts, positions, [HOT] * rows, generators)
        assert_vllm_logprobs(result, hf, sequences, 20)
        ranks |= set(result.logprobs.ranks.tolist())
    assert max(ranks) > 1


def test_chunk_and_decode_returns_its_decode_rows_logprobs(chunked):
    model, hf = chunked.model, chunked.hf
    sequences, firsts = prefilled(model, [6, 9])
    positions = [len(s) - 1 for s in sequences]
    chunk = prompt(CHUNK, seed=98)
    generators = [make_generator(3), make_generator(4)]
    logits, result = model.prefill_and_decode(2, chunk, 0, [0, 1], firsts, positions, [HOT] * 2, generators)
    assert_vllm_logprobs(result, hf, sequences, 20)
    assert torch.allclose(logits, hf_last_logits(hf, chunk), atol=ATOL)


def test_max_logprobs_is_bounded_by_max_topk_and_zero_compiles_tokens_only(zoo):
    assert NeuronConfig(max_topk=6).max_logprobs == 6
    with pytest.raises(NeuronConfigError, match=r"max_logprobs=30.*\[0, max_topk=8\]"):
        NeuronConfig(max_topk=8, max_logprobs=30)
    tokens_only = zoo.artifact("llama", batch_size=1, sequence_length=16, prefill_chunk_size=0, max_logprobs=0)
    sequences, firsts = prefilled(tokens_only.model, [5])
    result = tokens_only.model.decode([0], firsts, [len(sequences[0]) - 1])
    assert result.logprobs is None
    assert result.tokens == [int(hf_last_logits(tokens_only.hf, sequences[0]).argmax())]


TP_VOCAB, TP_LOCAL = 301, 151  # two ranks' slices; the second padded with one masked column


def tp_inputs() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(3, TP_VOCAB, generator=generator) * 3
    # greedy, hot with min_p, top-k 5 / top-p
    params = torch.tensor([[1.0, 1.0, 1.0, 0.0], [16.0, 1.0, 2.0, 0.1], [5.0, 0.8, 0.7, 0.0]])
    return logits, params, torch.rand(3, 1, generator=generator)


# logit_bias pairs on either side of the ranks' slice boundary (151), and an unused slot (0, 0.0).
TP_BIAS = (
    torch.tensor([[7, 200], [150, 151], [300, 0]], dtype=torch.int32),
    torch.tensor([[20.0, -5.0], [30.0, 10.0], [15.0, 0.0]]),
)


def tp_worker(rank: int, out: Path) -> None:
    import torch.distributed as dist

    logits, params, uniform = tp_inputs()
    local = torch.full((3, TP_LOCAL), -1e9)
    part = logits[:, rank * TP_LOCAL : (rank + 1) * TP_LOCAL]
    local[:, : part.shape[1]] = part
    cc = Collectives(2, dist.group.WORLD.group_name)
    offset = torch.tensor([rank * TP_LOCAL], dtype=torch.int32)
    torch.save(sample_with_logprobs(local, params, uniform, 16, 4, cc, offset, TP_VOCAB), out / f"rank{rank}.pt")
    got = sample_with_logprobs(local, params, uniform, 16, 4, cc, offset, TP_VOCAB, bias=TP_BIAS)
    torch.save(got, out / f"biased{rank}.pt")


def test_tensor_parallel_logprobs_combine_the_ranks_slices(tmp_path):
    """Each rank holds a vocabulary slice: the log-sum-exp, the rank and the top candidates are combined over the
    ranks, so every rank returns what one rank holding the whole vocabulary returns; with logit_bias too (the
    sampler draws from the biased logits, the logprobs stay the raw ones)."""
    logits, params, uniform = tp_inputs()
    want = sample_with_logprobs(logits, params, uniform, 16, 4)
    want_biased = sample_with_logprobs(logits, params, uniform, 16, 4, bias=TP_BIAS)
    run_ranks(tp_worker, 2, tmp_path, start_method="fork")
    for rank in range(2):
        for name, expected in ((f"rank{rank}", want), (f"biased{rank}", want_biased)):
            got = torch.load(tmp_path / f"{name}.pt")
            assert torch.equal(got[0], expected[0]) and torch.equal(got[2], expected[2])
            assert torch.allclose(got[1], expected[1], atol=1e-5)
    expected = logits.log_softmax(-1)
    for result in (want, want_biased):
        assert torch.allclose(result[1][:, 1:], expected.topk(4).values, atol=1e-5)
        assert torch.allclose(result[1][:, 0], expected.gather(-1, result[0][:, :1].long())[:, 0], atol=1e-5)
    assert want_biased[0][:, 0].tolist()[:2] == [7, 150]  # greedy takes the +20, the hot row the +30
