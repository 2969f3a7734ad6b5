"""Which engine options the user set: recorded by `vllm serve`'s own parser, read back from the VllmConfig.

vLLM's EngineArgs.create_engine_config replaces every unset option (None) with a default before the platform
sees the configuration, and VllmConfig does not record which values were explicit. A value that merely looks like
a default (e.g. `--max-num-seqs 256`, vLLM's offline default on a CPU platform) must still be refused when the
artifact cannot honour it.

vLLM hands the platform its CLI parser (AsyncEngineArgs.add_cli_args -> Platform.pre_register_and_update(parser),
vllm/engine/arg_utils.py:3214) before `vllm serve` parses the command line. record_user_options makes each tracked
option's argparse action also write the value it parsed into the Namespace's additional_config (USER_OPTIONS_KEY),
which vLLM carries unchanged through EngineArgs into VllmConfig.additional_config, in every process that gets the
configuration. UserOptions.of reads it back.

Through the Python API (vllm.LLM, EngineArgs) no parser runs and vLLM keeps no record: the tracked options count
as unset and the plugin fits vLLM's resolved values to the artifact (values within its limits are kept). Options
vLLM's configuration keeps as given (worker_cls, kv_cache_dtype, scheduler_cls, max_model_len, prefix caching)
are read from the configuration on both paths.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

USER_OPTIONS_KEY = "user_options"

TensorParallelCheck = Callable[[Path, int], None]

# EngineArgs fields whose unset value vLLM replaces with a default the platform cannot tell from an explicit one.
TRACKED = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_logprobs",
    "enable_chunked_prefill",
    "async_scheduling",
    "distributed_executor_backend",
    "dtype",
    "tensor_parallel_size",
)


@dataclass(frozen=True)
class UserOptions:
    """Options as the user gave them; None means unset."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_logprobs: int | None = None
    enable_chunked_prefill: bool | None = None
    async_scheduling: bool | None = None
    distributed_executor_backend: str | None = None
    dtype: str | None = None
    tensor_parallel_size: int | None = None

    @classmethod
    def of(cls, additional_config: dict[str, Any] | None) -> UserOptions:
        recorded = (additional_config or {}).get(USER_OPTIONS_KEY, {})
        return cls(**{name: recorded[name] for name in TRACKED if recorded.get(name) is not None})


def record_user_options(parser: argparse.ArgumentParser, refuse_tensor_parallel_size: TensorParallelCheck) -> None:
    """Make the parser record every tracked option the command line sets (and refuse a --tensor-parallel-size the
    artifact was not exported for while parsing, before vLLM's own checks fail on it with a traceback:
    refuse_tensor_parallel_size(model, tp) raises a ValueError saying what to change)."""
    # argparse has no public accessor for a parser's actions; _actions is its documented-by-use attribute.
    for action in parser._actions:
        if action.dest in TRACKED and not isinstance(action, _Recording):
            action.__class__ = type(f"Recording{type(action).__name__}", (_Recording, type(action)), {})
        elif action.dest == "additional_config" and not isinstance(action, _KeepingRecord):
            action.__class__ = type(f"Keeping{type(action).__name__}", (_KeepingRecord, type(action)), {})
        elif action.dest in ("model_tag", "model") and not isinstance(action, _CheckingModel):
            action.__class__ = type(f"Checking{type(action).__name__}", (_CheckingModel, type(action)), {})
        if isinstance(action, _Recording | _CheckingModel):
            action.refuse_tensor_parallel_size = refuse_tensor_parallel_size


def _recorded(namespace: argparse.Namespace) -> dict[str, Any]:
    return (getattr(namespace, "additional_config", None) or {}).get(USER_OPTIONS_KEY, {})


def _record(namespace: argparse.Namespace, values: dict[str, Any]) -> None:
    # A new dict every time: the parser's default additional_config object must stay empty.
    config = dict(getattr(namespace, "additional_config", None) or {})
    config[USER_OPTIONS_KEY] = {**config.get(USER_OPTIONS_KEY, {}), **values}
    namespace.additional_config = config


def _plain(value: object) -> object:
    return value if value is None or isinstance(value, bool | int | str) else str(value)


class _Recording(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        _record(namespace, {self.dest: _plain(getattr(namespace, self.dest))})
        _check_tensor_parallel_size(self, namespace)


class _KeepingRecord(argparse.Action):
    """--additional-config replaces the dict: keep what the tracked options recorded before it."""

    def __call__(self, parser, namespace, values, option_string=None):
        recorded = _recorded(namespace)
        super().__call__(parser, namespace, values, option_string)
        if recorded:
            _record(namespace, recorded)


class _CheckingModel(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        _check_tensor_parallel_size(self, namespace)


def _check_tensor_parallel_size(action: argparse.Action, namespace: argparse.Namespace) -> None:
    model = getattr(namespace, "model_tag", None) or getattr(namespace, "model", None)
    tp = _recorded(namespace).get("tensor_parallel_size")
    if model is None or tp is None:
        return
    try:
        action.refuse_tensor_parallel_size(Path(model), tp)
    except ValueError as error:
        raise argparse.ArgumentError(action, str(error)) from None
