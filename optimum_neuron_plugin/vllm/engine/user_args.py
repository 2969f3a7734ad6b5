"""Which engine options the user set: recorded by `vllm serve`'s own parser, read back from the VllmConfig.

vLLM's EngineArgs.create_engine_config replaces every unset option (None) with a default before the platform
sees the configuration, and VllmConfig does not record which values were explicit. A value that merely looks like
a default (e.g. `--max-num-seqs 256`, vLLM's offline default on a CPU platform) must still be refused when the
artifact cannot honour it.

vLLM hands the platform its CLI parser (AsyncEngineArgs.add_cli_args -> Platform.pre_register_and_update(parser),
vllm/engine/arg_utils.py:3214) after adding its arguments and before `vllm serve` parses the command line.
record_user_options wraps that parser's parse_known_args (what argparse calls for the parser, also as `vllm serve`'s
subcommand): it parses once more into a Namespace that already holds a marker for each tracked option, which
argparse keeps unless the command line sets the option (argparse's documented rule for a namespace's attributes),
and writes the options set into the Namespace's additional_config (USER_OPTIONS_KEY). vLLM carries it unchanged
through EngineArgs into VllmConfig.additional_config, in every process that gets the configuration. UserOptions.of
reads it back. Only argparse's public API is used: the parser's actions are not touched.

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
    "max_loras",
    "max_lora_rank",
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
    max_loras: int | None = None
    max_lora_rank: int | None = None

    @classmethod
    def of(cls, additional_config: dict[str, Any] | None) -> UserOptions:
        recorded = (additional_config or {}).get(USER_OPTIONS_KEY, {})
        return cls(**{name: recorded[name] for name in TRACKED if recorded.get(name) is not None})


def record_user_options(parser: argparse.ArgumentParser, refuse_tensor_parallel_size: TensorParallelCheck) -> None:
    """Make the parser record every tracked option the command line sets (and refuse a --tensor-parallel-size the
    artifact was not exported for while parsing, before vLLM's own checks fail on it with a traceback:
    refuse_tensor_parallel_size(model, tp) raises a ValueError saying what to change)."""
    parse = getattr(parser.parse_known_args, "__wrapped__", parser.parse_known_args)  # once per parser

    def parse_recording(args=None, namespace=None):
        marked = _marked(namespace)  # before parsing: argparse fills the caller's namespace in place
        parsed, extras = parse(args, namespace)
        given = [name for name in TRACKED if getattr(parse(args, marked)[0], name) is not _UNSET]
        if given:
            _record(parsed, {name: _plain(getattr(parsed, name)) for name in given})
        _check_tensor_parallel_size(parser, parsed, refuse_tensor_parallel_size)
        return parsed, extras

    parse_recording.__wrapped__ = parse
    parser.parse_known_args = parse_recording


_UNSET = object()  # a tracked option the command line did not set


def _marked(namespace: argparse.Namespace | None) -> argparse.Namespace:
    """A copy of the namespace where each tracked option holds _UNSET: argparse replaces an attribute the namespace
    already has only with a value from the command line, never with the option's default."""
    return argparse.Namespace(**{**vars(namespace or argparse.Namespace()), **dict.fromkeys(TRACKED, _UNSET)})


def _recorded(namespace: argparse.Namespace) -> dict[str, Any]:
    return (getattr(namespace, "additional_config", None) or {}).get(USER_OPTIONS_KEY, {})


def _record(namespace: argparse.Namespace, values: dict[str, Any]) -> None:
    # A new dict: the parser's default additional_config object must stay empty.
    config = dict(getattr(namespace, "additional_config", None) or {})
    config[USER_OPTIONS_KEY] = {**config.get(USER_OPTIONS_KEY, {}), **values}
    namespace.additional_config = config


def _plain(value: object) -> object:
    return value if value is None or isinstance(value, bool | int | str) else str(value)


def _check_tensor_parallel_size(
    parser: argparse.ArgumentParser, namespace: argparse.Namespace, refuse: TensorParallelCheck
) -> None:
    """A usage error like argparse's own: printed with the usage and exit status 2 (raised with exit_on_error=False)."""
    model = getattr(namespace, "model_tag", None) or getattr(namespace, "model", None)
    tp = _recorded(namespace).get("tensor_parallel_size")
    if model is None or tp is None:
        return
    try:
        refuse(Path(model), tp)
    except ValueError as error:
        refusal = argparse.ArgumentError(None, f"argument --tensor-parallel-size/-tp: {error}")
        if parser.exit_on_error:
            parser.error(str(refusal))
        raise refusal from None
