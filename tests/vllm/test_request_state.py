"""RequestState's token list: prompt then output, kept up to date as the runner appends sampled tokens, without a copy
of the whole context per read (read per row per step)."""

from __future__ import annotations


def request(prompt: list[int]):
    from vllm.sampling_params import SamplingParams

    from optimum_neuron_plugin.vllm.runner.request_state import RequestState

    return RequestState.create("r", prompt, SamplingParams(temperature=0.0))


def test_all_token_ids_follows_the_output_in_one_list():
    state = request([5, 6, 7])
    first = state.all_token_ids
    assert first == [5, 6, 7] and state.last_token_id == 7
    for token in (8, 9):
        state.output_token_ids.append(token)
        assert state.all_token_ids is first  # extended in place, not rebuilt
        assert state.last_token_id == token
    state.output_token_ids.extend([10, 11])
    assert state.all_token_ids == [5, 6, 7, 8, 9, 10, 11] and state.num_tokens == 7
    assert [state.token_at(i) for i in range(7)] == state.all_token_ids
    assert state.prompt_token_ids == [5, 6, 7]  # the prompt list is not the one extended


def test_resync_replaces_the_tokens():
    state = request([5, 6, 7])
    state.output_token_ids.extend([8, 9, 10])
    assert state.all_token_ids == [5, 6, 7, 8, 9, 10]
    state.resync([5, 6, 7, 8, 4])  # a preempted request resumes with the scheduler's list
    assert state.all_token_ids == [5, 6, 7, 8, 4] and state.last_token_id == 4
    state.output_token_ids.append(3)
    assert state.all_token_ids == [5, 6, 7, 8, 4, 3]
