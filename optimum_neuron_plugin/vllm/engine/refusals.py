"""The engine options an artifact cannot honour: one list of rules, each returning what to change or None.

Every rule sees what was asked (Asked: vLLM's configuration as built, the artifact, the options the user set, the
prefill mode) and the decisions the fit would apply (Fitted). engine_config.fit runs them all and reports every
failure in one error, so a command line with several problems is fixed in one round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import vllm.envs as envs
from vllm.config import VllmConfig

from ...artifact import cache_dtype, load_config
from ...config import NeuronConfig, reexport_command
from ...models.sharding import layout_for
from ..spec_decode.methods import speculation_problems
from .data_parallel import data_parallel_problems
from .fitted import Fitted
from .options import (
    PREFILL_MODE_ENV,
    PrefillMode,
    SerialReason,
    asked_prefill_mode,
    interleave_budget_options,
    prefill_target_itl,
    serial_reason,
    serves_on_neuron,
)
from .user_args import UserOptions


class ConfigMismatchError(ValueError):
    """The vLLM configuration asks for more than the artifact was compiled for."""


WORKER_CLS = "optimum_neuron_plugin.vllm.worker.NeuronWorker"
SCHEDULER_CLS = "optimum_neuron_plugin.vllm.scheduler.scheduler.NeuronScheduler"


@dataclass(frozen=True)
class Asked:
    vllm_config: VllmConfig
    artifact: NeuronConfig
    user: UserOptions
    mode: PrefillMode


Rule = Callable[[Asked, Fitted], "str | None"]


def speculation(asked: Asked, fitted: Fitted) -> str | None:
    return "; ".join(speculation_problems(asked.vllm_config, asked.artifact, asked.mode)) or None


def lora(asked: Asked, fitted: Fitted) -> str | None:
    """--enable-lora needs LoRA slots in the export; --max-loras and --max-lora-rank at most the export's."""
    config, nc = asked.vllm_config.lora_config, asked.artifact
    if config is None:
        return None
    rank = asked.user.max_lora_rank or config.max_lora_rank
    export = reexport_command(nc.to_dict(), Path(asked.vllm_config.model_config.model))
    if not nc.lora:
        return (
            f"--enable-lora needs an export with LoRA slots, this one has none: export again with them, e.g. "
            f"{export} --max-loras {config.max_loras} --max-lora-rank {rank}"
        )
    # vLLM's default rank (16) is not the user's: adapters are checked against the export's rank when loaded.
    rank = asked.user.max_lora_rank or nc.max_lora_rank
    excess = [f"--max-loras {config.max_loras} exceeds the export's {nc.max_loras} LoRA slots"] * (
        config.max_loras > nc.max_loras
    ) + [f"--max-lora-rank {rank} exceeds the export's max_lora_rank {nc.max_lora_rank}"] * (rank > nc.max_lora_rank)
    if excess:
        return (
            f"{'; '.join(excess)}: pass at most those, or export again with {export} "
            f"--max-loras {max(config.max_loras, nc.max_loras)} --max-lora-rank {max(rank, nc.max_lora_rank)}"
        )
    return None


def logits_processors(asked: Asked, fitted: Fitted) -> str | None:
    if asked.vllm_config.model_config.logits_processors:
        return "custom logits processors are not supported: remove --logits-processors"
    return None


def logits_processor_plugins(asked: Asked, fitted: Fitted) -> str | None:
    installed = sorted(ep.name for ep in entry_points(group="vllm.logits_processors"))
    if installed:
        return f"logits processor plugins are installed but cannot run: uninstall {', '.join(installed)}"
    return None


PROMPT_STORAGE = "PromptStorageConnector"
# Named, not imported: the front end that runs these checks needs no connector.
PROMPT_STORAGE_MODULE = "optimum_neuron_plugin.vllm.prompt_storage"
# The KV connectors the runner serves (runner/kv_transfer.py), and why the others are refused.
SERVED_CONNECTORS = ("ExampleConnector", "OffloadingConnector", PROMPT_STORAGE)
# The plugin's own connectors, named with the module vLLM imports them from (kv_connector_module_path).
PLUGIN_CONNECTORS = {PROMPT_STORAGE: PROMPT_STORAGE_MODULE}
CONNECTORS_REFUSED = {
    "NixlConnector": "the nixl wheel is not installed with the plugin and its Neuron memory registration is untested",
    "SimpleCPUOffloadConnector": "its host copies use CUDA memory operations; OffloadingConnector is the host tier",
}


def kv_transfer(asked: Asked, fitted: Fitted) -> str | None:
    config = asked.vllm_config.kv_transfer_config
    if config is None:
        return None
    name = config.kv_connector
    if name in PLUGIN_CONNECTORS and config.kv_connector_module_path != PLUGIN_CONNECTORS[name]:
        return (
            f"KV connector {name!r} is the plugin's: set kv_connector_module_path to {PLUGIN_CONNECTORS[name]!r} in "
            "--kv-transfer-config"
        )
    if (config.kv_connector_module_path and name not in PLUGIN_CONNECTORS) or name not in SERVED_CONNECTORS:
        why = CONNECTORS_REFUSED.get(name, "it is not one the plugin's runner was tested with")
        served = ", ".join(SERVED_CONNECTORS)
        return f"KV connector {name!r} is not supported ({why}): use one of {served}, or remove --kv-transfer-config"
    if not asked.artifact.chunked:
        return (
            f"KV connector {name!r} needs prefill chunk graphs (a request whose first blocks were loaded prefills from "
            "the position after them): export the model again with --prefill-chunk-size"
        )
    if serves_on_neuron():
        return (
            f"KV connector {name!r} runs on the CPU backend only (the Neuron pool lives in device memory, which the "
            "connector cannot address yet): remove --kv-transfer-config"
        )
    if name == "ExampleConnector" and asked.mode is not PrefillMode.SERIAL:
        return (
            f"KV connector {name!r} saves a prompt's blocks in the step that first schedules it, so the whole prompt "
            f"must prefill in that step: set {PREFILL_MODE_ENV}=serial (or --additional-config "
            '\'{"prefill_mode": "serial"}\')'
        )
    return None


def ec_transfer(asked: Asked, fitted: Fitted) -> str | None:
    if asked.vllm_config.ec_transfer_config is not None:
        return "encoder cache transfer is not supported: remove --ec-transfer-config"
    return None


def v2_model_runner(asked: Asked, fitted: Fitted) -> str | None:
    if envs.VLLM_USE_V2_MODEL_RUNNER:
        return "vLLM's V2 model runner protocol is not supported: unset VLLM_USE_V2_MODEL_RUNNER (or set it to 0)"
    return None


def async_scheduling(asked: Asked, fitted: Fitted) -> str | None:
    if asked.user.async_scheduling:
        return (
            "async scheduling is not supported (the runner keeps each request's tokens between steps): "
            "remove --async-scheduling"
        )
    return None


def chunked_prefill(asked: Asked, fitted: Fitted) -> str | None:
    explicit = asked.user.enable_chunked_prefill
    if asked.mode is PrefillMode.SERIAL and explicit:
        why, change = _why_serial(asked)
        return (
            f"--enable-chunked-prefill asks vLLM's scheduler to chunk prompts, but the prefill mode is serial (whole "
            f"prompts per step, chunked by the runner; {why}): remove it, or {change}"
        )
    if asked.mode is PrefillMode.INTERLEAVED and explicit is False:
        return (
            f"--no-enable-chunked-prefill contradicts {PREFILL_MODE_ENV}=interleaved (vLLM's scheduler chunks "
            f"prompts): remove it, or use {PREFILL_MODE_ENV}=serial"
        )
    return None


def interleave_budget(asked: Asked, fitted: Fitted) -> str | None:
    extra = asked.vllm_config.additional_config
    given = interleave_budget_options(extra)
    if asked.mode is PrefillMode.SERIAL and given:
        options = " and ".join(given)
        why, change = _why_serial(asked)
        return (
            f"{options} size interleaved prefill's steps, but the prefill mode is serial (whole prompts per step; "
            f"{why}): {change}, or unset {options}"
        )
    try:
        prefill_target_itl(extra)  # a target that is not a step time, or one set with a fixed budget
    except ValueError as error:
        return str(error)
    return None


def executor(asked: Asked, fitted: Fitted) -> str | None:
    wanted = asked.user.distributed_executor_backend
    if wanted not in (None, fitted.executor):
        return (
            f"distributed_executor_backend={wanted!r} is not supported (the plugin runs {fitted.tensor_parallel_size} "
            f"worker(s) with {fitted.executor!r}): remove --distributed-executor-backend"
        )
    return None


def worker_cls(asked: Asked, fitted: Fitted) -> str | None:
    given = asked.vllm_config.parallel_config.worker_cls
    if given not in ("auto", WORKER_CLS):
        return f"worker_cls={given!r} is not supported: remove --worker-cls"
    return None


def scheduler_cls(asked: Asked, fitted: Fitted) -> str | None:
    given = asked.vllm_config.scheduler_config.scheduler_cls
    if given not in (None, SCHEDULER_CLS):
        return (
            f"scheduler_cls={given!r} is not supported by the Neuron plugin: omit --scheduler-cls (the plugin's "
            "NeuronScheduler fails the requests of a graph call that raises, not the engine)"
        )
    return None


def kv_cache_dtype(asked: Asked, fitted: Fitted) -> str | None:
    given = asked.vllm_config.cache_config.cache_dtype
    artifact = asked.artifact
    if given in ("auto", *(("fp8", "fp8_e4m3") if artifact.kv_cache_dtype == "fp8" else ())):
        return None
    return (
        f"kv_cache_dtype={given!r} does not match the artifact's KV cache "
        f"({artifact.kv_cache_dtype or artifact.torch_dtype}, fixed at export): remove --kv-cache-dtype "
        "(or export the model again with --kv-cache-dtype fp8)"
    )


def data_parallel(asked: Asked, fitted: Fitted) -> str | None:
    return "; ".join(data_parallel_problems(asked.vllm_config.parallel_config)) or None


def block_size(asked: Asked, fitted: Fitted) -> str | None:
    cache, compiled = asked.vllm_config.cache_config, asked.artifact.block_size
    if not cache.user_specified_block_size or cache.block_size == compiled:
        return None
    return (
        f"block_size={cache.block_size} does not match the artifact's KV block size {compiled} (fixed at export: the "
        f"graphs read the cache by blocks of {compiled} positions): pass --block-size {compiled} or omit it, or export "
        f"the model again with --block-size {cache.block_size}"
    )


def kv_pool(asked: Asked, fitted: Fitted) -> str | None:
    cache, compiled = asked.vllm_config.cache_config, asked.artifact.num_blocks
    problems = []
    if cache.num_gpu_blocks_override is not None and cache.num_gpu_blocks_override > compiled:
        problems.append(
            f"num_gpu_blocks_override={cache.num_gpu_blocks_override} exceeds the artifact's KV pool of {compiled} "
            f"blocks (the null block included; its graphs are compiled for it): pass --num-gpu-blocks-override "
            f"{compiled} or less, or export the model again with --num-blocks {cache.num_gpu_blocks_override}"
        )
    if cache.kv_cache_memory_bytes is not None:
        block = kv_block_bytes(asked.vllm_config.model_config.model, asked.artifact)
        if cache.kv_cache_memory_bytes > compiled * block:
            problems.append(
                f"kv_cache_memory_bytes={cache.kv_cache_memory_bytes} exceeds the artifact's KV pool of {compiled} "
                f"blocks ({compiled * block} bytes per rank; its graphs are compiled for it): pass "
                f"--kv-cache-memory-bytes {compiled * block} or less, or export the model again with --num-blocks "
                f"{cache.kv_cache_memory_bytes // block}"
            )
    return "; ".join(problems) or None


def kv_block_bytes(model: str, artifact: NeuronConfig) -> int:
    """One block of every layer's K and V on a rank (its KV heads): what vLLM divides the pool's memory by."""
    _, args = load_config(Path(model))
    kv_heads = layout_for(args, artifact.tp_degree).kv_heads
    return args.num_hidden_layers * 2 * artifact.block_size * kv_heads * args.head_dim * cache_dtype(artifact).itemsize


def kv_events_without_prefix_cache(asked: Asked, fitted: Fitted) -> str | None:
    events = asked.vllm_config.kv_events_config
    if events is None or not events.enable_kv_cache_events or fitted.prefix_caching:
        return None
    why = "an export without prefill chunks" if not asked.artifact.chunked else "--no-enable-prefix-caching"
    return (
        f"--kv-events-config publishes what the prefix cache holds, but it is off ({why}): remove --kv-events-config, "
        "or serve with prefix caching (a chunked export, without --no-enable-prefix-caching)"
    )


def load_format(asked: Asked, fitted: Fitted) -> str | None:
    given = asked.vllm_config.load_config.load_format
    if given != "auto":
        return (
            f"load_format={given!r} is not supported (the artifact holds its weights, loaded as exported): "
            "remove --load-format"
        )
    return None


def logprobs_mode(asked: Asked, fitted: Fitted) -> str | None:
    given = asked.vllm_config.model_config.logprobs_mode
    if given != "raw_logprobs":
        return (
            f"logprobs_mode={given!r} is not supported (logprobs are the model's raw log-softmax, computed before "
            "any sampling parameter): remove --logprobs-mode"
        )
    return None


def dtype(asked: Asked, fitted: Fitted) -> str | None:
    given = asked.user.dtype
    if given not in (None, "auto") and asked.vllm_config.model_config.dtype != fitted.dtype:
        return (
            f"dtype={given} does not match the artifact's compiled dtype {asked.artifact.torch_dtype}: remove --dtype "
            "(or export the model again with the dtype you want)"
        )
    return None


def max_model_len(asked: Asked, fitted: Fitted) -> str | None:
    model_config, limit = asked.vllm_config.model_config, asked.artifact.sequence_length
    if model_config.original_max_model_len is not None and model_config.max_model_len > limit:
        return (
            f"max_model_len={model_config.max_model_len} exceeds the artifact's compiled sequence_length={limit}: "
            f"pass --max-model-len {limit} or less (or omit it), or export the model again with a larger "
            "--sequence-length"
        )
    return None


def max_num_seqs(asked: Asked, fitted: Fitted) -> str | None:
    given, limit = asked.user.max_num_seqs, asked.artifact.batch_size
    if given is not None and given > limit:
        return (
            f"max_num_seqs={given} exceeds the artifact's compiled batch_size={limit}: pass --max-num-seqs {limit} "
            "or less (or omit it), or export the model again with a larger --batch-size"
        )
    return None


def tensor_parallel_size(asked: Asked, fitted: Fitted) -> str | None:
    return tensor_parallel_problem(asked.vllm_config.parallel_config.tensor_parallel_size, asked.artifact)


def tensor_parallel_problem(tp: int, artifact: NeuronConfig) -> str | None:
    if tp in (1, artifact.tp_degree):
        return None
    return (
        f"tensor_parallel_size={tp} does not match the artifact's tp_degree={artifact.tp_degree}: "
        f"omit --tensor-parallel-size (or pass {artifact.tp_degree}), or export again with --tensor-parallel-size {tp}"
    )


def pipeline_parallel(asked: Asked, fitted: Fitted) -> str | None:
    if asked.vllm_config.parallel_config.pipeline_parallel_size != 1:
        return (
            "pipeline parallelism is not supported by the Neuron plugin: omit --pipeline-parallel-size "
            "(use --data-parallel-size to run several engines)"
        )
    return None


def max_logprobs(asked: Asked, fitted: Fitted) -> str | None:
    given, compiled = asked.user.max_logprobs, asked.artifact.max_logprobs
    if not asked.artifact.on_device_sampling or given is None or 0 <= given <= compiled:
        return None
    return (
        f"max_logprobs={given}{' (the whole vocabulary)' if given < 0 else ''} exceeds the artifact's compiled "
        f"max_logprobs={compiled} (its decode graphs sample on device and return the top {compiled} logprobs): pass "
        f"--max-logprobs {compiled} or less (or omit it), or export the model again with a larger --max-logprobs "
        "(at most --max-topk) or with --no-on-device-sampling"
    )


def batched_tokens_hold_a_prompt(asked: Asked, fitted: Fitted) -> str | None:
    tokens, length = fitted.max_num_batched_tokens, fitted.max_model_len
    if asked.mode is PrefillMode.SERIAL and tokens < length:
        return (
            f"max_num_batched_tokens={tokens} cannot hold a full-length prompt (max_model_len={length}) in the serial "
            f"prefill mode, which schedules whole prompts: pass --max-num-batched-tokens "
            f"{length + fitted.max_num_seqs} (or omit it), lower --max-model-len, or set {PREFILL_MODE_ENV}=interleaved"
        )
    return None


SERIAL_DEFAULTS = {  # each reason the mode defaults to serial: how to say it, what would interleave
    SerialReason.NO_CHUNKS: ("the default for an export without prefill chunks", "export with --prefill-chunk-size"),
    SerialReason.NO_CHUNKED_PREFILL: (
        "the default with --no-enable-chunked-prefill",
        "remove --no-enable-chunked-prefill",
    ),
    SerialReason.SPECULATIVE: ("speculative decoding runs in the serial mode", "remove --speculative-config"),
}


def _why_serial(asked: Asked) -> tuple[str, str]:
    """Why the mode is serial (the user's setting, or options.serial_reason) and what would interleave."""
    reason = serial_reason(
        asked.artifact.chunked, asked.user.enable_chunked_prefill, asked.vllm_config.speculative_config is not None
    )
    if asked_prefill_mode(asked.vllm_config.additional_config) is not None or reason is None:
        return f"set by {PREFILL_MODE_ENV}", f"set {PREFILL_MODE_ENV}=interleaved"
    return SERIAL_DEFAULTS[reason]


def batched_tokens_hold_a_chunk(asked: Asked, fitted: Fitted) -> str | None:
    """Interleaved prefill hands out whole chunks (interleave.py): a budget without room for one next to every decode
    would never schedule a prompt longer than what is left."""
    tokens, seqs = fitted.max_num_batched_tokens, fitted.max_num_seqs
    needed = min(asked.artifact.prefill_length, fitted.max_model_len) + seqs
    if asked.mode is PrefillMode.INTERLEAVED and tokens < needed:
        return (
            f"max_num_batched_tokens={tokens} cannot hold a prefill chunk ({needed - seqs} tokens) next to a decode "
            f"for each of max_num_seqs={seqs} requests in the interleaved prefill mode, which schedules whole chunks: "
            f"pass --max-num-batched-tokens {needed} or more (or omit it)"
        )
    return None


def batched_tokens_hold_the_decodes(asked: Asked, fitted: Fitted) -> str | None:
    tokens, seqs = fitted.max_num_batched_tokens, fitted.max_num_seqs
    if tokens < seqs:
        return (
            f"max_num_batched_tokens={tokens} is below max_num_seqs={seqs}: a step could not decode every running "
            f"request; pass --max-num-batched-tokens {seqs} or more (or omit it)"
        )
    return None


RULES: tuple[Rule, ...] = (
    tensor_parallel_size,
    pipeline_parallel,
    max_model_len,
    max_num_seqs,
    speculation,
    lora,
    logits_processors,
    logits_processor_plugins,
    kv_transfer,
    ec_transfer,
    v2_model_runner,
    async_scheduling,
    chunked_prefill,
    interleave_budget,
    executor,
    worker_cls,
    scheduler_cls,
    kv_cache_dtype,
    data_parallel,
    block_size,
    kv_pool,
    kv_events_without_prefix_cache,
    load_format,
    logprobs_mode,
    dtype,
    max_logprobs,
    batched_tokens_hold_a_prompt,
    batched_tokens_hold_a_chunk,
    batched_tokens_hold_the_decodes,
)


def problems(asked: Asked, fitted: Fitted) -> list[str]:
    return [message for rule in RULES if (message := rule(asked, fitted)) is not None]
