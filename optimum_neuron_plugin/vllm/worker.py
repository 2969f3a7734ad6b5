"""NeuronWorker: vLLM's worker for an exported artifact, one per tensor-parallel rank of each engine.

With tp_degree > 1 vLLM's multiprocess executor starts one worker process per rank and sends every rank the same
scheduler output: each joins the ranks' process group (the artifact's backend chooses it: gloo on the CPU backend;
on Neuron gloo for host tensors and TorchNeuron's "neuron" backend for device tensors), loads its shard and makes
the same graph calls in lockstep; vLLM reads the sampled tokens of rank 0 only (MultiprocExecutor.output_rank).
Each data-parallel engine has its own workers, artifact instance and cache, placed by placement.py.

Step protocol of vLLM 0.32: execute_model(scheduler_output) keeps the step's ModelRunnerOutput
and returns None, then sample_tokens(grammar_output) returns it. A step with no scheduled tokens
(it may still finish requests) returns the empty output from execute_model directly.
A step that samples for a structured-output request (vLLM's has_structured_output_requests) runs
its graph calls in sample_tokens instead: the graphs sample in the same call as the forward, and
vLLM computes the grammar bitmask between the two calls. Other steps keep running in execute_model,
where vLLM's multiprocess executor overlaps them with the scheduler's work.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from vllm.config import VllmConfig
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, DraftTokenIds, ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from ..artifact import load_neuron_config
from ..backends import get_backend
from ..backends.neuron import pin_cores
from ..placement import Rank
from ..runtime import NeuronModelForCausalLM
from ..runtime.dummy_step import dummy_step
from .engine.kv_spec import SUPPORTED_LAYOUTS, bytes_for_blocks, kv_cache_spec
from .engine.options import CPU_THREADS_ENV, cpu_threads, data_parallel_size, serves_on_neuron
from .log import get_logger
from .runner.health import fatal
from .runner.kv_transfer import KVTransfer
from .runner.model_runner import NeuronModelRunner

logger = get_logger(__name__)


class NeuronWorker(WorkerBase):
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ) -> None:
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        self.model: NeuronModelForCausalLM | None = None
        self.runner: NeuronModelRunner | None = None
        self._output: ModelRunnerOutput | None = None
        self._waiting_for_grammar: SchedulerOutput | None = None  # a step that runs in sample_tokens
        self._ran_dummy_step = False

    # ---- startup ------------------------------------------------------------------------------

    def init_device(self) -> None:
        self.device = torch.device("cpu")  # what vLLM sees; the runtime owns the Neuron device
        rank = self.placement()
        threads = cpu_threads(rank)
        torch.set_num_threads(threads)
        logger.info(
            "engine %d of %d: graphs run with %d intra-op thread(s) (set %s to change)",
            rank.dp_rank,
            rank.dp_size,
            threads,
            CPU_THREADS_ENV,
        )
        if serves_on_neuron():
            pin_cores(rank)
        if rank.tp_size > 1 and not dist.is_initialized():
            # The artifact's backend joins the ranks: gloo on the CPU backend; on Neuron, device tensors (the graphs'
            # collectives) over TorchNeuron's native "neuron" backend and host tensors (uniforms, tokens) over gloo.
            backend = get_backend(load_neuron_config(Path(self.model_config.model)))
            backend.init_process_group(self.rank, rank.tp_size, self.distributed_init_method, timedelta(minutes=30))

    def placement(self) -> Rank:
        """This worker's place among the server's ranks: its engine (DP rank) and its rank in the engine."""
        parallel = self.parallel_config
        return Rank(
            dp_rank=parallel.data_parallel_rank_local or 0,
            dp_size=data_parallel_size(self.vllm_config.additional_config),
            tp_rank=self.local_rank,
            tp_size=parallel.tensor_parallel_size,
        )

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        path = self.model_config.model
        logger.info("loading the exported model at %s", path)
        self.model = NeuronModelForCausalLM.from_pretrained(path)
        self.runner = NeuronModelRunner(self.model, self.vllm_config)

    def get_model(self) -> NeuronModelForCausalLM:
        return self.model

    def get_model_inspection(self) -> str:
        nc = self.model.neuron_config
        return f"{self.model.args.architecture} (compiled: {nc})"

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return kv_cache_spec(self.model)

    def get_supported_kv_cache_layouts(self) -> list[str]:
        # The default asks vLLM's attention backends, which this worker does not use.
        return list(SUPPORTED_LAYOUTS)

    def determine_available_memory(self) -> int:
        """The bytes vLLM sizes its block pool from (kv_spec.py): --kv-cache-memory-bytes (fit.py refuses one above
        the compiled pool), else the compiled pool's."""
        asked = self.cache_config.kv_cache_memory_bytes
        return (
            asked
            if asked is not None
            else bytes_for_blocks(self.get_kv_cache_spec(), self.model.neuron_config.num_blocks)
        )

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        """Nothing to allocate (the runtime owns the pool): vLLM's block count, at most the compiled one, is logged."""
        blocks, nc = kv_cache_config.num_blocks, self.model.neuron_config
        if blocks > nc.num_blocks:
            raise ValueError(
                f"vLLM sized the KV pool at {blocks} blocks, above the artifact's {nc.num_blocks}: pass "
                f"--num-gpu-blocks-override {nc.num_blocks} or less, or export the model again with --num-blocks {blocks}"
            )
        self.cache_config.num_gpu_blocks = blocks
        self.runner.kv_transfer = KVTransfer.create(self.vllm_config, kv_cache_config, self.model)
        usable = blocks - 1  # vLLM's block pool keeps the null block back
        logger.info(
            "KV cache pool: %d blocks of %d tokens (%d tokens, %d full-length sequences of %d; %.1f MiB per rank) of "
            "the artifact's %d",
            usable, nc.block_size, usable * nc.block_size, usable * nc.block_size // self.model_config.max_model_len,
            self.model_config.max_model_len, bytes_for_blocks(self.get_kv_cache_spec(), blocks) / 2**20,
            nc.num_blocks - 1,
        )  # fmt: skip

    def update_max_model_len(self, max_model_len: int) -> None:
        self.model_config.max_model_len = max_model_len

    def compile_or_warm_up_model(self) -> CompilationTimes:
        # Graphs were compiled at export time; one warm-up call of each kind makes the first
        # request's latency representative.
        seconds = self.runner.warm_up()
        logger.info("warm-up of the compiled graphs took %.2f s", seconds)
        return CompilationTimes(language_model=0.0, encoder=0.0)

    # ---- steps --------------------------------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        # Graph calls are guarded inside execute (their failures fail their requests); anything
        # else raised here stops the engine (health.py), with one log line naming the cause.
        with fatal("the step's request bookkeeping (update_states)"):
            self.runner.update_states(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            with fatal("the KV connector's step without graphs"):
                return self.runner.execute_without_graphs(scheduler_output)
        if scheduler_output.has_structured_output_requests:
            self._waiting_for_grammar = scheduler_output
            return None
        with fatal("the step (execute)"):
            self._output = self.runner.execute(scheduler_output)
        return None

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        scheduler_output, self._waiting_for_grammar = self._waiting_for_grammar, None
        if scheduler_output is not None:
            with fatal("the step (execute with the grammar bitmask)"):
                return self.runner.execute(scheduler_output, grammar_output)
        output, self._output = self._output, None
        return output if output is not None else EMPTY_MODEL_RUNNER_OUTPUT

    def get_kv_connector_handshake_metadata(self) -> dict[tuple[int, int], object] | None:
        """What a KV connector's scheduler side needs from this rank (NixlConnector: its agent's address), keyed by
        (pipeline rank, tensor-parallel rank) as vLLM's engine core merges them."""
        transfer = self.runner.kv_transfer if self.runner is not None else None
        metadata = transfer.handshake_metadata() if transfer is not None else None
        return None if metadata is None else {(0, self.local_rank): metadata}

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        return self.runner.take_draft_token_ids() if self.runner is not None else None

    def execute_dummy_batch(self) -> None:
        """vLLM's step of an idle data-parallel engine of a MoE model (DPEngineCoreProc keeps the engines in lock
        step): a real decode graph call that changes no request's K/V (runtime/dummy_step.py)."""
        if self.model is None:
            return
        if not self._ran_dummy_step:
            logger.info("idle data-parallel engine: dummy decode steps keep it in step with the other engines")
            self._ran_dummy_step = True
        dummy_step(self.model)

    # ---- housekeeping -------------------------------------------------------------------------

    def check_health(self) -> None:
        # Never called by vLLM 0.32's UniProcExecutor; health.py says what stops the engine instead.
        return None

    def synchronize_device(self) -> None:
        return None

    def reset_encoder_cache(self) -> None:
        return None

    def get_cache_block_size_bytes(self) -> int:
        return bytes_for_blocks(self.get_kv_cache_spec(), 1)

    # LoRA adapters (runner/lora_slots.py): vLLM calls these on --lora-modules, /v1/load_lora_adapter and the like.

    def add_lora(self, lora_request) -> bool:
        return self._loras().add(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self._loras().remove(lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        return self._loras().pin(lora_id)

    def list_loras(self) -> set[int]:
        return set() if self.runner is None or self.runner.loras is None else self.runner.loras.ids()

    def _loras(self):
        if self.runner is None or self.runner.loras is None:
            raise ValueError("LoRA adapters need `vllm serve --enable-lora` on an export with LoRA slots")
        return self.runner.loras

    def sleep(self, level: int = 1) -> None:
        logger.warning("sleep mode is not supported by the Neuron plugin; ignored")

    def wake_up(self, tags: list[str] | None = None) -> None:
        logger.warning("sleep mode is not supported by the Neuron plugin; ignored")

    def shutdown(self) -> None:
        if self.runner is not None:
            self.runner.shutdown()
        self.runner = None
        self.model = None
        if dist.is_initialized():
            dist.destroy_process_group()
