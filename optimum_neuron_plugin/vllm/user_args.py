"""Which engine options the user set, read before vLLM fills in its defaults.

vLLM's EngineArgs.create_engine_config replaces every unset option (None) with a default before the
platform sees the configuration, and VllmConfig does not record which values were explicit. A value
that merely looks like a default (e.g. `--max-num-seqs 256`, vLLM's offline default on a CPU
platform) must still be refused when the artifact cannot honour it. create_engine_config calls
`current_platform.pre_register_and_update()` first, before it changes anything: NeuronPlatform reads
the caller's EngineArgs there (capture) and hands the snapshot to check_and_update_config.

When no EngineArgs is found (a VllmConfig built by hand), max_num_seqs / max_num_batched_tokens
count as unset when they equal a default vLLM computes (EngineArgs.get_batch_defaults, times the
world size, doubled in throughput mode), and the switches count as unset.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class UserArgs:
    """EngineArgs values as the user gave them; None (or "auto") means unset."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    async_scheduling: bool | None = None
    distributed_executor_backend: str | None = None
    worker_cls: str = "auto"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    model: str | None = None
    tensor_parallel_size: int | None = None
    seen: bool = False  # read from the EngineArgs that built the configuration


def capture(max_depth: int = 4) -> UserArgs | None:
    """The options of the EngineArgs whose create_engine_config is running (found up the call stack)."""
    from vllm.engine.arg_utils import EngineArgs

    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        args = frame.f_locals.get("self")
        if frame.f_code.co_name == "create_engine_config" and isinstance(args, EngineArgs):
            values = {f.name: _plain(getattr(args, f.name, None)) for f in fields(UserArgs) if f.name != "seen"}
            return UserArgs(**{k: v for k, v in values.items() if v is not None}, seen=True)
        frame = frame.f_back
    return None


def _plain(value: object) -> object:
    """dtype may be a torch.dtype or a string; keep strings for messages and comparisons."""
    return value if value is None or isinstance(value, bool | int | str) else str(value).removeprefix("torch.")


def vllm_default_max_num_seqs(world_size: int, throughput: bool) -> set[int]:
    """Every max_num_seqs vLLM may pick when the user sets none (before capping it to max_num_batched_tokens)."""
    return _defaults(world_size, throughput)[1]


def vllm_default_max_num_batched_tokens(world_size: int, throughput: bool) -> set[int]:
    return _defaults(world_size, throughput)[0]


def _defaults(world_size: int, throughput: bool) -> tuple[set[int], set[int]]:
    from vllm.config import SchedulerConfig
    from vllm.engine.arg_utils import EngineArgs

    tokens, seqs = EngineArgs.get_batch_defaults(world_size)
    factor = 2 if throughput else 1
    return (
        {v * factor for v in tokens.values()} | {SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS * factor},
        {v * factor for v in seqs.values()} | {SchedulerConfig.DEFAULT_MAX_NUM_SEQS * factor},
    )
