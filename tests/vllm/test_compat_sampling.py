"""compat.py's sampling and speculative decoding entries against vLLM's real objects: each does what its callers
(sampling/, runner/prompt_logprobs.py, spec_decode/methods.py) rely on, so a vLLM release that changes one fails here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.served import SEQUENCE_LENGTH

VOCAB = 64


def test_raw_logprobs_are_the_float32_log_softmax():
    from optimum_neuron_plugin.vllm.compat import raw_logprobs

    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    got = raw_logprobs(logits)
    assert got.dtype == torch.float32
    assert torch.allclose(got, torch.log_softmax(logits.float(), dim=-1))


def test_gather_logprobs_gives_the_token_then_the_top_n_and_the_tokens_rank():
    from optimum_neuron_plugin.vllm.compat import gather_logprobs

    logprobs = torch.log_softmax(torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0]]), dim=-1)
    gathered = gather_logprobs(logprobs, 2, torch.tensor([2, 0]))
    assert gathered.logprob_token_ids.tolist() == [[2, 0, 2], [0, 3, 2]]
    assert torch.equal(gathered.logprobs[:, 0], logprobs[[0, 1], [2, 0]])
    assert gathered.selected_token_ranks.tolist() == [2, 4]


@pytest.fixture(scope="module")
def processing():
    from vllm.config import VllmConfig

    from optimum_neuron_plugin.vllm.compat import LogitsProcessing

    return LogitsProcessing(VllmConfig())


def test_logits_processing_applies_vllms_masks_and_builtin_processors(processing):
    from vllm import SamplingParams

    rows = [
        (SamplingParams(min_tokens=3, stop_token_ids=[7]), [1, 2], [4]),  # 1 output token of 3: stop token 7 banned
        (SamplingParams(logit_bias={5: 10.0}), [1, 2], []),
        (SamplingParams(min_tokens=1, stop_token_ids=[7]), [1, 2], [4]),  # reached: nothing banned
    ]
    params = [p for p, _, _ in rows]
    processing.set_rows(rows)
    allowed = torch.zeros(3, VOCAB, dtype=torch.bool)
    allowed[2, 10:] = True  # row 2 may only produce tokens below 10
    got = processing.apply(torch.zeros(3, VOCAB), params, [o for _, _, o in rows], allowed)
    assert torch.isneginf(got[0]).nonzero().flatten().tolist() == [7]
    assert got[1, 5] == 10.0 and int((got[1] != 0).sum()) == 1
    assert torch.isneginf(got[2]).nonzero().flatten().tolist() == list(range(10, VOCAB))

    processing.set_rows([(SamplingParams(min_p=0.5), [1], [])])  # fewer rows: the others are removed
    scaled = torch.full((1, VOCAB), -10.0)
    scaled[0, :3] = torch.tensor([2.0, 1.9, 0.0])  # p(2) / p(0) = e^-2 < 0.5: dropped, as the low tail
    after = processing.apply_after_temperature(scaled.clone())
    assert (~torch.isneginf(after[0])).nonzero().flatten().tolist() == [0, 1]


def test_the_grammar_bitmask_masks_the_rows_of_structured_requests():
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

    from optimum_neuron_plugin.vllm.compat import apply_grammar_bitmask_to_rows

    bitmask = np.zeros((2, VOCAB // 32), dtype=np.int32)
    bitmask[0, 0] = 1 << 3  # request "b" allows token 3
    bitmask[1, 1] = 1 << 0  # request "a" allows token 32
    grammar = GrammarOutput(["b", "a"], bitmask)
    logits = torch.zeros(3, VOCAB)
    apply_grammar_bitmask_to_rows(SchedulerOutput.make_empty(), grammar, ["a", "free", "b"], logits)
    assert (~torch.isneginf(logits[0])).nonzero().flatten().tolist() == [32]
    assert not torch.isneginf(logits[1]).any()
    assert (~torch.isneginf(logits[2])).nonzero().flatten().tolist() == [3]


@pytest.fixture(scope="module")
def ngram_config(spec_dir):
    from vllm.config import ModelConfig, SpeculativeConfig, VllmConfig

    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_max=2, prompt_lookup_min=1)
    return VllmConfig(model_config=ModelConfig(str(spec_dir)), speculative_config=spec)


def test_the_ngram_proposer_drafts_the_chosen_rows_of_a_wider_table(ngram_config):
    from optimum_neuron_plugin.vllm.compat import ngram_proposer, propose_ngrams

    rows = ngram_config.scheduler_config.max_num_seqs + 2  # more rows than vLLM sizes its buffers for
    proposer = ngram_proposer(ngram_config, rows)
    table = np.zeros((rows, SEQUENCE_LENGTH), dtype=np.int32)
    lengths = np.zeros(rows, dtype=np.int32)
    # Row 3: the longest n-gram (9 9) matches first at position 0, so its drafts are the two tokens after it.
    for row, tokens in ((rows - 1, [4, 5, 6, 7, 4, 5]), (0, [1, 2, 3, 1]), (3, [9, 9, 9, 9])):
        table[row, : len(tokens)] = tokens
        lengths[row] = len(tokens)
    table[1, :4] = [1, 2, 1, 2]  # not asked: no drafts
    assert propose_ngrams(proposer, 3, table, lengths, [rows - 1, 0, 3]) == [[6, 7, 4], [2, 3, 1], [9, 9]]
    assert propose_ngrams(proposer, 2, table, lengths, [0]) == [[2, 3]]
