"""min_tokens, allowed_token_ids and bad_words as bitmask rows for the on-device sampler: the tokens they leave allowed
are the ones vLLM's own processing leaves finite (v1/sample/ops/bad_words.py, the allowed-ids mask, min_tokens'
stop-token ban), ANDed with a grammar row; an on-device artifact without the bitmask input refuses structured outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

VOCAB = 100
WORDS = 4  # ceil(100 / 32)


def state(output_token_ids: list[int], **params):
    from vllm.sampling_params import SamplingParams

    from optimum_neuron_plugin.vllm.runner.request_state import RequestState

    bad_words = params.pop("bad_words_token_ids", None)
    sampling = SamplingParams(**params)
    sampling._bad_words_token_ids = bad_words
    sampling._all_stop_token_ids.add(2)  # EOS, as vLLM's input processor adds it
    request = RequestState.create("r", [1, 2, 3], sampling, default_seed=0)
    request.output_token_ids = list(output_token_ids)
    return request


def vllm_allowed(request) -> np.ndarray:
    """What vLLM's sampler leaves finite in a row of logits for this request."""
    from vllm.v1.sample.ops.bad_words import apply_bad_words

    logits = torch.zeros(1, VOCAB)
    params = request.params
    if params.allowed_token_ids:
        mask = torch.ones(VOCAB, dtype=torch.bool)
        mask[params.allowed_token_ids] = False
        logits[0, mask] = float("-inf")
    if params.bad_words_token_ids:
        apply_bad_words(logits, {0: params.bad_words_token_ids}, [request.output_token_ids])
    if len(request.output_token_ids) < params.min_tokens:
        logits[0, sorted(params.all_stop_token_ids)] = float("-inf")
    return torch.isfinite(logits[0]).numpy()


def device_allowed(bitmask: torch.Tensor, row: int) -> np.ndarray:
    from optimum_neuron_plugin.vllm.sampling.token_constraints import unpack

    return unpack(bitmask[row])[:VOCAB]


def test_constraint_rows_allow_what_vllm_leaves_finite():
    from optimum_neuron_plugin.vllm.sampling.token_constraints import constrained_bitmask

    requests = [
        state([], max_tokens=5),  # unconstrained: all ones
        state([4, 5], min_tokens=3, stop_token_ids=[7]),  # stops (7, EOS 2) banned
        state([4, 5, 6], min_tokens=3, stop_token_ids=[7]),  # min_tokens reached
        state([4], allowed_token_ids=[3, 31, 32, 63, 64, 99]),  # word edges
        state([8, 9], bad_words_token_ids=[[5], [9, 10], [8, 11], [1, 9, 12], [8, 9, 14], [7, 8, 9, 13]]),
        state([8, 9], allowed_token_ids=[2, 7, 10, 20], bad_words_token_ids=[[9, 10]], min_tokens=4, stop_token_ids=[7]),
    ]  # fmt: skip
    bitmask = constrained_bitmask(None, requests, WORDS)
    assert bitmask.dtype == torch.int32 and tuple(bitmask.shape) == (len(requests), WORDS)
    assert bitmask[0].tolist() == [-1] * WORDS
    for row, request in enumerate(requests):
        expected = vllm_allowed(request)
        assert (device_allowed(bitmask, row) == expected).all(), row
    assert device_allowed(bitmask, 5).nonzero()[0].tolist() == [20]
    assert constrained_bitmask(None, requests[:1], WORDS) is None


def test_a_grammar_row_is_anded_and_min_tokens_yields_when_only_stops_remain():
    from optimum_neuron_plugin.vllm.sampling.token_constraints import constrained_bitmask, pack

    grammar = np.zeros(WORDS * 32, dtype=bool)
    grammar[[2, 7, 40]] = True
    rows = torch.stack([pack(grammar), pack(grammar)])
    banned = constrained_bitmask(rows, [state([], min_tokens=2, stop_token_ids=[7]), state([])], WORDS)
    assert device_allowed(banned, 0).nonzero()[0].tolist() == [40]
    assert torch.equal(banned[1], rows[1])
    grammar[40] = False  # only stop tokens left: vLLM restores them rather than leave nothing (min_tokens processor)
    only_stops = constrained_bitmask(pack(grammar)[None], [state([], min_tokens=2, stop_token_ids=[7])], WORDS)
    assert device_allowed(only_stops, 0).nonzero()[0].tolist() == [2, 7]


@pytest.mark.parametrize("on_device_sampling", [True, False])
def test_an_on_device_artifact_without_the_bitmask_refuses_structured_outputs(on_device_sampling):
    """An on-device artifact exported with token_bitmask false has no bitmask input: its structured requests get a
    400 saying to export again; a host-sampling one masks host logits either way."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams

    from optimum_neuron_plugin.vllm.engine.limits import ServingLimits
    from optimum_neuron_plugin.vllm.engine.options import PrefillMode
    from optimum_neuron_plugin.vllm.engine.request_checks import check_sampling

    limits = ServingLimits(
        128, 128, 4, on_device_sampling, 256, PrefillMode.SERIAL, structured_outputs=not on_device_sampling
    )
    params = SamplingParams(structured_outputs=StructuredOutputsParams(choice=["red", "green", "blue"]))
    if on_device_sampling:
        with pytest.raises(VLLMValidationError, match="export the model again"):
            check_sampling(limits, params)
    else:
        check_sampling(limits, params)
    check_sampling(limits, SamplingParams())
