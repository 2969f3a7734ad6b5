"""ServingLimits: what an artifact allows, fixed when the engine config is fitted to it (engine/fit.py) and read by
every request check (request_checks.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .options import PrefillMode


@dataclass(frozen=True)
class ServingLimits:
    """What the artifact allows; read by validate_request in the front-end process."""

    max_model_len: int
    sequence_length: int
    batch_size: int
    on_device_sampling: bool
    max_topk: int
    prefill_mode: PrefillMode
    # Structured outputs (and on device min_tokens, allowed_token_ids, bad_words) can be served: host sampling, or
    # decode graphs with a token bitmask input.
    structured_outputs: bool = True
    # On-device sampling: top logprobs the decode graphs return (0: none); None: host sampling, any count.
    device_logprobs: int | None = None
    # On-device sampling: logit_bias entries per request the decode graphs take (0: none); None: host sampling.
    device_logit_bias: int | None = None
    # The artifact has prompt_logits graphs (exported with --prompt-logprobs): prompt_logprobs can be served.
    prompt_logprobs: bool = False
    # A KV connector is configured (--kv-transfer-config): requests may carry its kv_transfer_params.
    kv_transfer: bool = False
    # --enable-lora on an export with slots: the artifact directory an adapter is checked against before vLLM loads
    # it (adapter_checks.py); None: no adapters are served.
    lora_artifact: str | None = None
