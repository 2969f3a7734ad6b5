"""Reject requests the compiled artifact cannot serve, with a message saying what to change.

Raised as vLLM's VLLMValidationError (a ValueError), which the OpenAI server turns into a 400.
A request is never accepted and then silently served differently from what it asked for.
"""

from __future__ import annotations

from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams

from .engine_config import ServingLimits

# SamplingParams fields whose default means "off" and that the runner does not implement.
UNSUPPORTED_DEFAULTS = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "prompt_logprobs": None,
    "logprob_token_ids": None,
    "prompt_logprob_token_ids": None,
    "thinking_token_budget": None,
    "trace_decode_token_ids": None,
}


def check_request(limits: ServingLimits, engine_input: object, params: object) -> None:
    if not isinstance(params, SamplingParams):
        raise VLLMValidationError("only text generation is supported by the Neuron plugin (no pooling / embeddings)")
    check_prompt(limits, engine_input)
    check_sampling(limits, params)


def check_prompt(limits: ServingLimits, engine_input: object) -> None:
    if not isinstance(engine_input, dict) or engine_input.get("type") != "token":
        kind = engine_input.get("type") if isinstance(engine_input, dict) else type(engine_input).__name__
        raise VLLMValidationError(
            f"only token prompts are supported by the Neuron plugin (got {kind!r} input: no prompt embeddings, "
            "multimodal or encoder-decoder inputs)"
        )
    check_prompt_length(limits, len(engine_input["prompt_token_ids"]))


def check_prompt_length(limits: ServingLimits, prompt_len: int) -> None:
    # One position is left for the first generated token (vLLM's own rule too).
    limit = min(limits.max_model_len, limits.sequence_length) - 1
    if prompt_len == 0:
        raise VLLMValidationError("the prompt is empty", parameter="prompt", value=0)
    if prompt_len > limit:
        raise VLLMValidationError(
            f"the prompt has {prompt_len} tokens but this model accepts at most {limit} "
            f"(max_model_len={limits.max_model_len}, compiled sequence_length={limits.sequence_length}, "
            "minus one position for the generated token): shorten the prompt",
            parameter="prompt",
            value=prompt_len,
        )


def check_sampling(limits: ServingLimits, params: SamplingParams) -> None:
    if params.structured_outputs is not None:
        raise VLLMValidationError(
            "structured output (json / regex / choice / grammar) is not supported by the Neuron plugin",
            parameter="structured_outputs",
        )
    for name, default in UNSUPPORTED_DEFAULTS.items():
        value = getattr(params, name, default)
        if _is_set(value, default):
            raise VLLMValidationError(
                f"{name} is not supported by the Neuron plugin: remove it from the request", parameter=name, value=value
            )
    if limits.on_device_sampling:
        _check_on_device_sampling(limits, params)


def _is_set(value: object, default: object) -> bool:
    if default is None:
        return value is not None and value != [] and value != {}
    return value != default


def _check_on_device_sampling(limits: ServingLimits, params: SamplingParams) -> None:
    """Tokens after the first are sampled inside the graph, which returns no logits."""
    hint = "(this artifact samples on device; export it with --no-on-device-sampling to get host logits)"
    if params.logprobs is not None:
        raise VLLMValidationError(f"logprobs are not available {hint}", parameter="logprobs", value=params.logprobs)
    if params.min_p > 0.0:
        raise VLLMValidationError(f"min_p is not supported {hint}", parameter="min_p", value=params.min_p)
    if params.min_tokens > 0:
        raise VLLMValidationError(
            f"min_tokens is not supported {hint}", parameter="min_tokens", value=params.min_tokens
        )
    if params.top_k > limits.max_topk:
        raise VLLMValidationError(
            f"top_k={params.top_k} exceeds the artifact's on-device max_topk={limits.max_topk}: use top_k <= "
            f"{limits.max_topk} (or -1 for no limit) {hint}",
            parameter="top_k",
            value=params.top_k,
        )
