"""Reject requests the compiled artifact cannot serve, with a message saying what to change.

Raised as vLLM's VLLMValidationError (a ValueError), which the OpenAI server turns into a 400.
A request is never accepted and then silently served differently from what it asked for: the
SamplingParams fields the plugin honours are listed below, and every other field must keep its
SamplingParams() default, so a field added by a later vLLM is refused until someone supports it.
"""

from __future__ import annotations

import msgspec
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams

from .limits import ServingLimits

# Honoured with any artifact: vLLM's front end, output processor or scheduler implements them,
# or the runner does (temperature / top_k / top_p / seed on host and device alike).
SUPPORTED = frozenset(
    {
        "n",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "max_tokens",
        "detokenize",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "output_kind",
        "stream_interval",
        "skip_clone",
        "output_text_buffer_length",
        "flat_logprobs",
        "repetition_detection",  # a stop condition of vLLM's scheduler
        "skip_reading_prefix_cache",  # vLLM's prefix cache honours it
        "watermarking",  # vLLM's input processor resolves it (off without a watermark config)
        "_watermarking_skipped",
        "_eos_token_id",
        "_all_stop_token_ids",
        "structured_outputs",  # vLLM compiles the grammar; the runner masks with its bitmask (check_sampling)
        "logprobs",  # host logits, or the decode graphs' top max_logprobs (check_logprobs)
        "prompt_logprobs",  # the prompt_logits graphs' logits (check_prompt_logprobs)
        "min_p",  # vLLM's processor on host logits, the decode graphs' fourth sampling parameter on device
        "logit_bias",  # vLLM's processor, or the decode graphs' logit_bias pairs (check_logit_bias)
    }
)
# Honoured only where every token is sampled on the host: the penalties need each request's token counts,
# and token_generation with on-device sampling returns tokens (host_sampling.py).
HOST_LOGITS_ONLY = frozenset({"presence_penalty", "frequency_penalty", "repetition_penalty"})
# Honoured on the host, and on the device through the decode graphs' token bitmask (token_constraints.py).
TOKEN_MASK = frozenset({"min_tokens", "allowed_token_ids", "bad_words", "_bad_words_token_ids"})
# Why a field is refused, where it is not obvious.
WHY = {
    "prompt_logprob_token_ids": "the runner returns the prompt tokens' and the most likely tokens' logprobs, not "
    "chosen ids': use prompt_logprobs",
    "logprob_token_ids": "the runner returns the sampled token's and the most likely tokens' logprobs, not chosen "
    "ids' (the on-device sampler computes only its top max_logprobs): use logprobs",
}
DEFAULTS = SamplingParams()
FIELDS = tuple(field.name for field in msgspec.structs.fields(SamplingParams))
ON_DEVICE_HINT = "(this artifact samples on device; export it with --no-on-device-sampling to get host logits)"


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


def check_extra_args(limits: ServingLimits, params: SamplingParams) -> None:
    """extra_args carries only a KV connector's kv_transfer_params (P/D proxies set them), and only to a server with
    a connector: anything else would be accepted and ignored."""
    extra = dict(params.extra_args or {})
    if limits.kv_transfer:
        extra.pop("kv_transfer_params", None)
    if extra:
        only = "kv_transfer_params (with --kv-transfer-config)" if limits.kv_transfer else "nothing"
        raise VLLMValidationError(
            f"extra_args {sorted(extra)} are not supported by the Neuron plugin (it reads {only}): remove them from "
            "the request",
            parameter="extra_args",
            value=extra,
        )


def check_sampling(limits: ServingLimits, params: SamplingParams) -> None:
    if params.prompt_logprobs == 0 and params.logprobs is None and not limits.prompt_logprobs:
        # vLLM's chat completions set prompt_logprobs = top_logprobs (0 unless given) whenever `echo` is on, even
        # when the client asked for no logprobs at all: without prompt_logits graphs that request asks for none.
        params.prompt_logprobs = None
    if params.structured_outputs is not None and not limits.structured_outputs:
        raise VLLMValidationError(
            "structured output (json / regex / choice / grammar, response_format, tool_choice required or named) "
            "needs an artifact whose on-device sampling graphs take a token bitmask; this one was exported without "
            "it (token_bitmask false): export the model again with the default token_bitmask",
            parameter="structured_outputs",
        )
    check_extra_args(limits, params)
    host_only = HOST_LOGITS_ONLY if limits.on_device_sampling else frozenset()
    no_mask = TOKEN_MASK if not limits.structured_outputs else frozenset()
    for name in FIELDS:
        if (
            name in SUPPORTED
            or name == "extra_args"
            or (name in HOST_LOGITS_ONLY | TOKEN_MASK and name not in host_only | no_mask)
        ):
            continue
        value = getattr(params, name)
        if not _is_default(value, getattr(DEFAULTS, name)):
            public = name.lstrip("_").removesuffix("_token_ids") if name.startswith("_") else name
            if name in no_mask:
                where = "(this artifact's decode graphs have no token bitmask input: export it again)"
            else:
                where = ON_DEVICE_HINT if name in host_only else "by the Neuron plugin: remove it from the request"
                where += f" ({WHY[name]})" if name in WHY else ""
            raise VLLMValidationError(f"{public} is not supported {where}", parameter=public, value=value)
    check_logprobs(limits, params)
    check_prompt_logprobs(limits, params)
    check_logit_bias(limits, params)
    if limits.on_device_sampling and params.top_k > limits.max_topk:
        raise VLLMValidationError(
            f"top_k={params.top_k} exceeds the artifact's on-device max_topk={limits.max_topk}: use top_k <= "
            f"{limits.max_topk} (or -1 for no limit) {ON_DEVICE_HINT}",
            parameter="top_k",
            value=params.top_k,
        )


def check_logprobs(limits: ServingLimits, params: SamplingParams) -> None:
    """On-device sampling returns the top max_logprobs of each token (vLLM's --max-logprobs is fitted to it, so vLLM
    refuses larger counts first; this names the export option)."""
    compiled, asked = limits.device_logprobs, params.logprobs
    if compiled is None or asked is None or 0 <= asked <= compiled and compiled > 0:
        return
    wanted = "the whole vocabulary's" if asked < 0 else f"the top {asked}"
    returns = f"return the top {compiled}" if compiled else "return none (exported with --max-logprobs 0)"
    raise VLLMValidationError(
        f"logprobs={asked} asks for {wanted} logprobs, but this artifact's decode graphs sample on device and "
        f"{returns}: ask for logprobs <= {compiled}"
        + (" " if compiled else " (omit logprobs) ")
        + "or export the model again with a larger --max-logprobs (at most --max-topk) or --no-on-device-sampling",
        parameter="logprobs",
        value=asked,
    )


def check_logit_bias(limits: ServingLimits, params: SamplingParams) -> None:
    """On-device sampling takes at most the compiled max_logit_bias (token id, bias) pairs per request."""
    compiled, asked = limits.device_logit_bias, len(params.logit_bias or {})
    if compiled is None or asked <= compiled:
        return
    raise VLLMValidationError(
        f"logit_bias has {asked} entries, but this artifact's decode graphs sample on device and take at most "
        f"{compiled} per request{' (exported with --max-logit-bias 0)' if not compiled else ''}: pass at most "
        f"{compiled} or export the model again with a larger --max-logit-bias (or --no-on-device-sampling)",
        parameter="logit_bias",
        value=asked,
    )


def check_prompt_logprobs(limits: ServingLimits, params: SamplingParams) -> None:
    """Prompt logprobs need the prompt_logits graphs (every position's logits); vLLM bounds the count by its
    --max-logprobs."""
    if params.prompt_logprobs is None or limits.prompt_logprobs:
        return
    raise VLLMValidationError(
        prompt_logprobs_refusal(params.prompt_logprobs), parameter="prompt_logprobs", value=params.prompt_logprobs
    )


def prompt_logprobs_refusal(asked: int) -> str:
    """What an artifact without prompt_logits graphs answers a request for prompt logprobs (http_checks.py too)."""
    return (
        f"prompt_logprobs={asked} (also completions echo with logprobs) needs every prompt position's logits, but "
        "this artifact's prefill graphs return the last position's only: omit prompt_logprobs or export the model "
        "again with --prompt-logprobs (chunked prefill: --prefill-chunk-size > 0)"
    )


def _is_default(value: object, default: object) -> bool:
    """Equal to the default, where None and empty containers are the same "unset"."""
    if value == default:
        return True
    empty = lambda v: v is None or (isinstance(v, list | dict | set | tuple) and not v)  # noqa: E731
    return empty(value) and empty(default)
