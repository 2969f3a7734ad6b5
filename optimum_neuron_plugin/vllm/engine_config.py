"""Fit vLLM's engine configuration to a compiled artifact (called from NeuronPlatform.check_and_update_config).

The artifact fixes the shapes: batch_size rows of KV cache, sequence_length positions per row,
tp_degree inside the graphs. vLLM must never schedule beyond them, so this module defaults
max_num_seqs / max_model_len from neuron_config.json, refuses explicit values that do not fit,
and switches off every vLLM feature that would run vLLM's own model code (torch.compile, CUDA
graphs, prefix caching, async scheduling, multi-process workers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vllm.config import CompilationMode, VllmConfig
from vllm.config.compilation import CUDAGraphMode

from ..config import NEURON_CONFIG_FILE, NeuronConfig, NeuronConfigError
from .log import get_logger
from .options import PrefillMode, prefill_chunk_budget, prefill_mode

logger = get_logger(__name__)

WORKER_CLS = "optimum_neuron_plugin.vllm.worker.NeuronWorker"
SCHEDULER_CLS = "optimum_neuron_plugin.vllm.scheduler.NeuronScheduler"

# What vLLM picks for max_num_seqs / max_num_batched_tokens when the user sets nothing
# (EngineArgs.get_batch_defaults, x2 in throughput mode). vLLM does not record whether the
# value was explicit, so a value in these sets is treated as "unset".
VLLM_DEFAULT_MAX_NUM_SEQS = frozenset({128, 256, 512, 1024, 2048})
VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS = frozenset({2048, 4096, 8192, 16384, 32768})


@dataclass(frozen=True)
class ServingLimits:
    """What the artifact allows; read by validate_request in the front-end process."""

    max_model_len: int
    sequence_length: int
    batch_size: int
    on_device_sampling: bool
    max_topk: int
    prefill_mode: PrefillMode


class ConfigMismatchError(ValueError):
    """The vLLM configuration asks for more than the artifact was compiled for."""


def load_neuron_config(model: str) -> NeuronConfig:
    directory = Path(model)
    if not (directory / NEURON_CONFIG_FILE).is_file():
        raise ConfigMismatchError(
            f"{model!r} is not an exported model directory (no {NEURON_CONFIG_FILE}): export it first, "
            f"e.g. `optimum-cli export neuron --model <hf model> <output dir>`, then `vllm serve <output dir>`"
        )
    try:
        return NeuronConfig.load(directory)
    except NeuronConfigError as error:
        raise ConfigMismatchError(str(error)) from None


def fit_to_artifact(vllm_config: VllmConfig) -> ServingLimits:
    """Update vllm_config in place for the artifact at model_config.model; raise when it cannot fit."""
    neuron_config = load_neuron_config(vllm_config.model_config.model)
    mode = prefill_mode(vllm_config.additional_config)
    _fit_max_model_len(vllm_config, neuron_config)
    _fit_max_num_seqs(vllm_config, neuron_config)
    _fit_parallelism(vllm_config, neuron_config)
    _fit_scheduler(vllm_config, neuron_config, mode)
    _fit_kv_cache(vllm_config)
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
    )


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


def _fit_max_num_seqs(vllm_config: VllmConfig, neuron_config: NeuronConfig) -> None:
    scheduler_config = vllm_config.scheduler_config
    limit = neuron_config.batch_size
    if scheduler_config.max_num_seqs <= limit:
        return
    if _looks_like_default_max_num_seqs(scheduler_config):
        scheduler_config.max_num_seqs = limit
        return
    raise ConfigMismatchError(
        f"max_num_seqs={scheduler_config.max_num_seqs} exceeds the artifact's compiled batch_size={limit}: "
        f"pass --max-num-seqs {limit} or less (or omit it), or export the model again with a larger --batch-size"
    )


def _looks_like_default_max_num_seqs(scheduler_config) -> bool:
    value = scheduler_config.max_num_seqs
    return value in VLLM_DEFAULT_MAX_NUM_SEQS or value == scheduler_config.max_num_batched_tokens


def _fit_parallelism(vllm_config: VllmConfig, neuron_config: NeuronConfig) -> None:
    """Tensor parallelism happens inside the compiled graphs: vLLM runs one worker."""
    parallel_config = vllm_config.parallel_config
    tp = parallel_config.tensor_parallel_size
    if tp not in (1, neuron_config.tp_degree):
        raise ConfigMismatchError(
            f"tensor_parallel_size={tp} does not match the artifact's tp_degree={neuron_config.tp_degree}: "
            f"omit --tensor-parallel-size (or pass {neuron_config.tp_degree}); the compiled graphs already "
            f"shard the model over {neuron_config.tp_degree} core(s)"
        )
    if parallel_config.pipeline_parallel_size != 1 or parallel_config.data_parallel_size != 1:
        raise ConfigMismatchError(
            "pipeline and data parallelism are not supported by the Neuron plugin: omit "
            "--pipeline-parallel-size / --data-parallel-size (run one server per artifact copy instead)"
        )
    parallel_config.tensor_parallel_size = 1
    parallel_config.world_size = 1
    parallel_config.distributed_executor_backend = "uni"
    parallel_config.worker_cls = WORKER_CLS


def _fit_scheduler(vllm_config: VllmConfig, neuron_config: NeuronConfig, mode: PrefillMode) -> None:
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
        budget = min(scheduler_config.max_num_batched_tokens, seqs * max_model_len)
        scheduler_config.max_num_batched_tokens = max(budget, max_model_len + seqs)
    else:
        scheduler_config.enable_chunked_prefill = True
        calls = prefill_chunk_budget(vllm_config.additional_config)
        if scheduler_config.max_num_batched_tokens in VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS:
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
    scheduler_config.max_num_batched_tokens = max(
        scheduler_config.max_num_batched_tokens, scheduler_config.max_num_seqs
    )
    scheduler_config.verify_max_model_len(max_model_len)


def kv_blocks_needed(max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """Blocks for every admitted request at full length, plus the null block vLLM's pool keeps back.

    With this many blocks vLLM's scheduler never runs out of KV blocks, so it never preempts a
    running request to admit another: admission is bounded by max_num_seqs (<= batch_size) alone.
    """
    return max_num_seqs * -(-max_model_len // block_size) + 1


def _fit_kv_cache(vllm_config: VllmConfig) -> None:
    cache_config = vllm_config.cache_config
    cache_config.enable_prefix_caching = False
    # The runtime owns the KV cache (batch_size rows); vLLM's blocks are bookkeeping only.
    needed = kv_blocks_needed(
        vllm_config.scheduler_config.max_num_seqs,
        vllm_config.model_config.max_model_len,
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
    from ..artifact import torch_dtype

    vllm_config.model_config.dtype = torch_dtype(neuron_config)


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
