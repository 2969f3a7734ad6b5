"""Repetition, frequency and presence penalties on host logits (sampling/penalties.py): each request's token counts
are kept from step to step and updated with its new tokens only, and the penalised logits are exactly those of vLLM's
own penalties over the whole token lists (vllm/v1/sample/ops/penalties.py apply_all_penalties), on a long context,
step after step, with one or several new tokens per step and a resumed request's replaced tokens."""

from __future__ import annotations

import pytest
import torch

VOCAB = 1000
PROMPT = 3000  # a long context: every prompt token occurs several times


def request(req_id: str, seed: int, **penalties):
    from vllm.sampling_params import SamplingParams

    from optimum_neuron_plugin.vllm.runner.request_state import RequestState

    prompt = torch.randint(0, VOCAB // 2, (PROMPT,), generator=torch.Generator().manual_seed(seed)).tolist()
    return RequestState.create(req_id, prompt, SamplingParams(temperature=0.0, **penalties))


def vllm_penalised(logits: torch.Tensor, states) -> torch.Tensor:
    """vLLM's sampler's penalties over every row's full prompt and output lists."""
    from vllm.utils.torch_utils import make_tensor_with_pad
    from vllm.v1.sample.ops.penalties import apply_all_penalties

    value = lambda name: torch.tensor([getattr(s.params, name) for s in states], dtype=torch.float32)  # noqa: E731
    prompts = make_tensor_with_pad([s.prompt_token_ids for s in states], pad=VOCAB, device="cpu", dtype=torch.int64)
    return apply_all_penalties(
        logits.clone(), prompts, value("presence_penalty"), value("frequency_penalty"), value("repetition_penalty"),
        [list(s.output_token_ids) for s in states],
    )  # fmt: skip


@pytest.fixture(scope="module")
def sampler():
    from vllm.config import VllmConfig

    from optimum_neuron_plugin.vllm.sampling.host_sampling import HostSampler

    return HostSampler(VllmConfig())


def test_penalised_logits_equal_vllms_step_after_step(sampler):
    states = [
        request("repetition", 0, repetition_penalty=1.3),
        request("frequency", 1, frequency_penalty=0.7, presence_penalty=-0.4),
        request("none", 2),
        request("all", 3, repetition_penalty=0.8, frequency_penalty=-0.3, presence_penalty=1.1),
    ]
    draws = torch.Generator().manual_seed(4)
    for step in range(8):
        logits = torch.randn(len(states), VOCAB, generator=draws) * 4
        expected = vllm_penalised(logits, states)
        assert torch.equal(sampler.process(logits, states), expected), step
        for state in states:  # one token, or several (accepted drafts), often ones already seen
            new = torch.randint(0, VOCAB, (1 + step % 3,), generator=draws).tolist()
            state.output_token_ids.extend(new + state.output_token_ids[-2:])
    assert states[2].penalty_counts is None  # a request without penalties keeps no counts


def test_kept_counts_equal_counts_rebuilt_from_scratch(sampler):
    from optimum_neuron_plugin.vllm.sampling.penalties import PenaltyCounts

    state = request("r", 5, frequency_penalty=0.5)
    for step in range(5):
        state.output_token_ids.extend([step, 7, step * 3])
        kept = state.counted_tokens(VOCAB)
    rebuilt = PenaltyCounts.of_prompt(state.prompt_token_ids, VOCAB)
    rebuilt.update(state.output_token_ids)
    assert torch.equal(kept.prompt_mask, rebuilt.prompt_mask) and torch.equal(kept.output_counts, rebuilt.output_counts)
    assert int(kept.output_counts[7]) == 5 and kept.counted == 15

    state.resync(state.prompt_token_ids + [9, 9])  # a resumed request adopts the scheduler's tokens
    logits = torch.randn(1, VOCAB)
    assert torch.equal(sampler.process(logits, [state]), vllm_penalised(logits, [state]))
    assert int(state.penalty_counts.output_counts[9]) == 2 and int(state.penalty_counts.output_counts[7]) == 0
