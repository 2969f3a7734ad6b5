"""N-gram drafts (spec_decode/methods.py NgramDrafts): each slot's row of the token table is appended to with the
tokens its request gained since its last proposal, and the drafts are those vLLM's NgramProposer gives over the full
token list, step after step, whatever the slot held before (an earlier request, a resumed one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.served import SEQUENCE_LENGTH, SPECULATIVE_TOKENS

K = SPECULATIVE_TOKENS
SLOTS = 6


@pytest.fixture(scope="module")
def config(spec_dir):
    from vllm.config import ModelConfig, SpeculativeConfig, VllmConfig

    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=K, prompt_lookup_max=3, prompt_lookup_min=1)
    return VllmConfig(model_config=ModelConfig(str(spec_dir)), speculative_config=spec)


@pytest.fixture(scope="module")
def reference(config):
    """vLLM's proposer over one request's whole token list."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    proposer = NgramProposer(config)

    def propose(tokens: list[int]) -> list[int]:
        table = np.zeros((1, SEQUENCE_LENGTH), dtype=np.int32)
        table[0, : len(tokens)] = tokens
        return proposer.propose(K, [[0]], np.array([len(tokens)], dtype=np.int32), table)[0]

    return propose


def request(req_id: str, length: int, seed: int):
    from vllm.sampling_params import SamplingParams

    from optimum_neuron_plugin.vllm.runner.request_state import RequestState

    prompt = torch.randint(0, 6, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    return RequestState.create(req_id, prompt, SamplingParams(temperature=0.0))


def test_drafts_equal_vllms_over_the_full_token_lists(config, reference):
    from optimum_neuron_plugin.vllm.spec_decode.methods import NgramDrafts

    drafter = NgramDrafts(config, SLOTS)
    slots = {2: request("a", 40, 0), 0: request("b", 7, 1), 5: request("c", 90, 2)}
    draws = torch.Generator().manual_seed(3)
    for step in range(12):
        if step == 6:  # slot 2's request finishes, a shorter one takes the slot; slot 0's is resumed with other tokens
            slots[2] = request("d", 20, 4)
            slots[0].resync(slots[0].all_token_ids[:-3] + [5, 5])
        states = list(slots.values())
        lists = [s.all_token_ids for s in states]
        got = drafter.propose(list(slots), lists)
        assert got == [reference(tokens) for tokens in lists], step
        assert any(got), step  # the tokens recur: drafts to compare
        for slot, tokens in zip(slots, lists, strict=True):  # the row holds the request's tokens
            assert drafter.table[slot, : len(tokens)].tolist() == tokens
        for state in states:  # one to four new tokens (a token and accepted drafts)
            state.output_token_ids.extend(torch.randint(0, 6, (1 + step % 4,), generator=draws).tolist())
