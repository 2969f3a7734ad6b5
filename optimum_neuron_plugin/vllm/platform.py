"""NeuronPlatform: vLLM's view of a host that runs compiled graphs (Neuron cores or the CPU reference backend).

Tensors that vLLM sees stay on the host (device_type "cpu"); the runtime moves data to the
Neuron device itself. vLLM's own model code, kernels and attention backends are never used.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from vllm.platforms.interface import Platform, PlatformEnum

from ..backends.neuron import neuron_core_count
from .engine.options import backend_requested, serves_on_neuron

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from .engine.limits import ServingLimits

# vllm.config imports this module while it resolves the platform: modules that import vllm.config
# (engine_config, request_checks) are imported inside the methods that need them; neither imports this one.


class NeuronPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "neuron"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"
    simple_compile_backend: str = "eager"
    supported_quantization: list[str] = []

    # Set by check_and_update_config in the process that builds the engine config, which is the
    # process that validates requests (front end); None until a model is configured. Process-wide
    # because vLLM's validate_request hook receives no configuration: one model per process.
    serving_limits: ServingLimits | None = None

    def is_cpu(self) -> bool:
        # No torch accelerator exists here: vLLM must take its host paths, e.g. skip
        # torch.accelerator.empty_cache() at teardown, which raises without an accelerator.
        return True

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return cls.device_name

    @classmethod
    def device_count(cls) -> int:
        """NeuronCores visible to this process when serving on Neuron, else the host (one device)."""
        return neuron_core_count() if serves_on_neuron() else 1

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        """The host's memory, on Neuron too. vLLM asks in the API-server process (EngineArgs.get_batch_defaults),
        which must never start the Neuron runtime: torch-neuronx's memory query starts it, and a started runtime
        reserves every NeuronCore it sees, so the engine's workers would find their cores in use. vLLM uses the
        figure for batch-size defaults only, which the artifact's shapes replace (engine_config.fit_to_artifact)."""
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return 0.0

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        """Nothing to select: the runtime owns its Neuron cores."""

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        """No device RNG: every request samples from its own host torch.Generator."""

    @classmethod
    def import_kernels(cls) -> None:
        """No vLLM kernels are used (vllm._C of a CPU wheel may not even load on this CPU)."""

    @classmethod
    def import_ir_kernels(cls) -> None:
        """No vLLM IR kernels are used."""

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def update_block_size_for_backend(cls, vllm_config: VllmConfig) -> None:
        """No vLLM attention backend: the block size is the artifact's (engine/fit.py sets it)."""

    @classmethod
    def pre_register_and_update(cls, parser=None) -> None:
        """With the CLI parser (`vllm serve`, before it parses): record which options the command line sets, and
        check the requests' bodies where SamplingParams cannot tell what the client asked (http_checks.py)."""
        if parser is not None:
            from .engine.fit import refuse_tensor_parallel_size
            from .engine.http_checks import add_http_checks
            from .engine.user_args import record_user_options

            record_user_options(parser, refuse_tensor_parallel_size)
            add_http_checks(parser)

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        if backend_requested() == "neuron" and neuron_core_count() == 0:
            raise RuntimeError(
                "ONP_BACKEND=neuron but no NeuronCore is visible (no /dev/neuron*, torch-neuronx missing, or "
                "NEURON_RT_VISIBLE_CORES empty): serve on a trn2/trn3 host with the [neuron] extra, or set ONP_BACKEND=cpu "
                "for an artifact exported with --backend cpu"
            )
        if vllm_config.model_config is None:
            return
        from .engine.fit import fit_to_artifact

        cls.serving_limits = fit_to_artifact(vllm_config)

    @classmethod
    def validate_request(cls, processed_inputs, params) -> None:
        if cls.serving_limits is not None:
            from .engine.request_checks import check_request

            check_request(cls.serving_limits, processed_inputs, params)

    def get_max_output_tokens(self, prompt_len: int) -> int:
        # The OpenAI server calls this before it caps max_tokens to max_model_len - prompt_len: a prompt
        # that fills the whole sequence gets the plugin's message instead of "max_tokens must be at least 1, got 0".
        if self.serving_limits is not None and prompt_len > 0:
            from .engine.request_checks import check_prompt_length

            check_prompt_length(self.serving_limits, prompt_len)
        return super().get_max_output_tokens(prompt_len)

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        raise NotImplementedError("the Neuron plugin runs compiled graphs; vLLM attention backends are not used")
