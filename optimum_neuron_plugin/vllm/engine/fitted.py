"""What fitting the engine to an artifact decides (fit.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .limits import ServingLimits
from .options import PrefillMode


@dataclass(frozen=True)
class Fitted:
    """Every decision the fit makes; apply() writes them, nothing else changes the configuration."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    prefill_mode: PrefillMode  # interleaved: vLLM's scheduler chunks prompts (enable_chunked_prefill)
    tensor_parallel_size: int
    executor: str  # vLLM's distributed_executor_backend
    data_parallel_size: int
    prefix_caching: bool  # vLLM's own (cache_config.enable_prefix_caching)
    block_size: int  # vLLM's KV block size: the artifact's
    max_logprobs: int
    dtype: torch.dtype
    limits: ServingLimits  # what validate_request checks each request against
    generation_overrides: dict[str, float] = field(default_factory=dict)
    environment: tuple[tuple[str, str], ...] = ()  # set unless already set
    warnings: tuple[str, ...] = ()
