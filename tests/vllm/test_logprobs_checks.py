"""Per-request logprobs limits: an on-device-sampling artifact returns the top max_logprobs of each token, so a request
asking for more (or the whole vocabulary) gets a 400 naming the compiled limit; host sampling has none."""

from __future__ import annotations

import pytest


def limits(device_logprobs: int | None, device_logit_bias: int | None = 32):
    from optimum_neuron_plugin.vllm.engine.limits import ServingLimits
    from optimum_neuron_plugin.vllm.engine.options import PrefillMode

    on_device = device_logprobs is not None
    return ServingLimits(
        128, 128, 4, on_device, 256, PrefillMode.SERIAL, device_logprobs=device_logprobs,
        device_logit_bias=device_logit_bias if on_device else None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("compiled", "asked", "message"),
    [
        (5, 6, "logprobs=6 asks for the top 6 logprobs, but this artifact's decode graphs sample on device and "
         "return the top 5: ask for logprobs <= 5 or export the model again with a larger --max-logprobs"),
        (5, -1, "logprobs=-1 asks for the whole vocabulary's logprobs"),
        (0, 0, "return none (exported with --max-logprobs 0): ask for logprobs <= 0 (omit logprobs) or export"),
    ],
)  # fmt: skip
def test_a_request_beyond_the_compiled_logprobs_is_refused(compiled, asked, message):
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    from optimum_neuron_plugin.vllm.engine.request_checks import check_sampling

    with pytest.raises(VLLMValidationError) as error:
        check_sampling(limits(compiled), SamplingParams(logprobs=asked))
    assert message in str(error.value)


def test_logprobs_within_the_limit_or_on_host_are_served():
    from vllm.sampling_params import SamplingParams

    from optimum_neuron_plugin.vllm.engine.request_checks import check_sampling

    for asked in (0, 3, 5):
        check_sampling(limits(5), SamplingParams(logprobs=asked))
    check_sampling(limits(0), SamplingParams())
    check_sampling(limits(None), SamplingParams(logprobs=-1))


def test_chosen_ids_logprobs_are_refused_saying_why():
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    from optimum_neuron_plugin.vllm.engine.request_checks import check_sampling

    for params, why in (
        (
            SamplingParams(logprob_token_ids=[3, 4]),
            "not chosen ids' (the on-device sampler computes only its top max_logprobs): use logprobs",
        ),
        (SamplingParams(prompt_logprob_token_ids=[3]), "not chosen ids': use prompt_logprobs"),
    ):
        for device_logprobs in (20, None):
            with pytest.raises(VLLMValidationError, match="is not supported by the Neuron plugin: remove it") as error:
                check_sampling(limits(device_logprobs), params)
            assert why in str(error.value)


def test_prompt_logprobs_need_the_prompt_logits_graphs():
    """An artifact without prompt_logits graphs refuses prompt_logprobs naming the export option; chat `echo`'s
    implied prompt_logprobs=0 (no logprobs asked) is dropped there, kept where the graphs exist."""
    import dataclasses

    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    from optimum_neuron_plugin.vllm.engine.request_checks import check_sampling

    without, with_graphs = limits(20), dataclasses.replace(limits(20), prompt_logprobs=True)
    with pytest.raises(VLLMValidationError, match="export the model again with --prompt-logprobs"):
        check_sampling(without, SamplingParams(prompt_logprobs=2))
    echo = SamplingParams(prompt_logprobs=0)
    check_sampling(without, echo)
    assert echo.prompt_logprobs is None
    for asked in (0, 2, -1):
        params = SamplingParams(prompt_logprobs=asked)
        check_sampling(with_graphs, params)
        assert params.prompt_logprobs == asked


def test_logit_bias_beyond_the_compiled_pairs_is_refused_naming_the_limit():
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    from optimum_neuron_plugin.vllm.engine.request_checks import check_sampling

    bias = {token: 1.0 for token in range(9)}
    check_sampling(limits(5, 9), SamplingParams(logit_bias=bias, min_p=0.1))
    check_sampling(limits(None), SamplingParams(logit_bias={token: 1.0 for token in range(500)}))
    for compiled, message in (
        (8, "logit_bias has 9 entries, but this artifact's decode graphs sample on device and take at most 8 per "
         "request: pass at most 8 or export the model again with a larger --max-logit-bias"),
        (0, "take at most 0 per request (exported with --max-logit-bias 0)"),
    ):  # fmt: skip
        with pytest.raises(VLLMValidationError) as error:
            check_sampling(limits(5, compiled), SamplingParams(logit_bias=bias))
        assert message in str(error.value)
    with pytest.raises(VLLMValidationError, match="presence_penalty is not supported"):
        check_sampling(limits(5), SamplingParams(presence_penalty=0.5))
