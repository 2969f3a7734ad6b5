"""PromptStorageConnector: P/D over shared storage that hands the decode side every prompt token's KV but the last.

The prefill server (kv_producer) saves the KV of a prompt's first len - 1 tokens (its partial last block included) to
one file under shared_storage_path, named by those tokens' hash, once the step that computes them has run. The decode
server (kv_consumer) finds that file for the same prompt and reports len - 1 external tokens to vLLM's scheduler, which
then schedules the prompt's last token alone: the runner feeds it as a decode row (token_generation, sampled like any
decode), so the decode server runs no prefill graph for a transferred request. vLLM's ExampleConnector, by contrast,
moves whole blocks only and leaves the prompt's tail to a prefill call.

Both sides are vLLM's connector protocol, unchanged: the scheduler side answers get_num_new_matched_tokens and builds
each step's metadata (which prompts to load into which blocks, which to save); the worker side (runner/kv_transfer.py)
loads before the step's graphs and saves after them. A file that cannot be read fails only its request: its blocks are
reported as load errors, and vLLM's kv_load_failure_policy ("fail", the default: the request ends with an error;
"recompute": it is prefilled locally) decides. Files are written to a temporary name and renamed, so a file that
exists is complete.

Use: --kv-transfer-config '{"kv_connector": "PromptStorageConnector", "kv_connector_module_path":
"optimum_neuron_plugin.vllm.prompt_storage", "kv_role": "kv_producer" | "kv_consumer",
"kv_connector_extra_config": {"shared_storage_path": DIR}}'.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from safetensors import SafetensorError
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.core.sched.output import SchedulerOutput

from .log import get_logger

logger = get_logger(__name__)

DEFAULT_STORAGE = "/tmp"


def prompt_file(storage: str | Path, prompt_token_ids: list[int]) -> Path:
    """Where the KV of the prompt's first len - 1 tokens is stored."""
    key = torch.tensor(prompt_token_ids[:-1], dtype=torch.int64).numpy().tobytes()
    return Path(storage) / f"{hashlib.sha256(key).hexdigest()}.safetensors"


@dataclass
class PromptTransfer:
    """The KV of positions [skip, tokens) of one prompt, in the blocks block_ids (one per block_size positions)."""

    req_id: str
    path: Path
    tokens: int
    block_ids: list[int]
    skip: int = 0  # a load leaves positions its prefix-cache hit already holds

    def slots(self, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(block ids, offsets in the block) of positions skip .. tokens - 1."""
        positions = torch.arange(self.skip, self.tokens)
        blocks = torch.tensor(self.block_ids, dtype=torch.int64)[positions // block_size]
        return blocks, positions % block_size

    def blocks(self, block_size: int) -> set[int]:
        """The blocks the transfer writes."""
        return set(self.block_ids[self.skip // block_size : -(-self.tokens // block_size)])


@dataclass
class PromptStorageMetadata(KVConnectorMetadata):
    loads: list[PromptTransfer] = field(default_factory=list)
    saves: list[PromptTransfer] = field(default_factory=list)


class PromptStorageConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config=None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        config = vllm_config.kv_transfer_config
        self.storage = Path(config.get_from_extra_config("shared_storage_path", DEFAULT_STORAGE))
        self.block_size = vllm_config.cache_config.block_size
        self.saves_prompts, self.loads_prompts = config.is_kv_producer, config.is_kv_consumer
        # scheduler side
        self.pending_loads: dict[str, PromptTransfer] = {}  # blocks allocated, to load in the step that schedules it
        self.unsaved: dict[str, PromptTransfer] = {}  # producer: prompts whose first len - 1 tokens are not computed
        # worker side
        self.layers: dict[str, torch.Tensor] = {}  # name -> [num_blocks, 2, block_size, kv_heads, head_dim]
        self.step: PromptStorageMetadata | None = None
        self.saving: dict[Path, dict[str, torch.Tensor]] = {}
        self.load_errors: set[int] = set()

    # ---- scheduler side -----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        prompt = list(request.prompt_token_ids or [])
        tokens = len(prompt) - 1
        if not self.loads_prompts or tokens <= num_computed_tokens or not prompt_file(self.storage, prompt).exists():
            return 0, False
        return tokens - num_computed_tokens, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            prompt = list(request.prompt_token_ids)
            tokens = len(prompt) - 1
            path = prompt_file(self.storage, prompt)
            self.pending_loads[request.request_id] = PromptTransfer(
                request.request_id, path, tokens, [], skip=tokens - num_external_tokens
            )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = PromptStorageMetadata()
        computed: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            (block_ids,) = new.block_ids
            computed[new.req_id] = new.num_computed_tokens
            if new.req_id in self.pending_loads:
                load = self.pending_loads.pop(new.req_id)
                load.block_ids = list(block_ids)
                meta.loads.append(load)
            prompt = new.prompt_token_ids or []
            if self.saves_prompts and len(prompt) > 1:
                self.unsaved[new.req_id] = PromptTransfer(
                    new.req_id, prompt_file(self.storage, prompt), len(prompt) - 1, list(block_ids)
                )
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            computed[req_id] = cached.num_computed_tokens[i]
            new_blocks = cached.new_block_ids[i]
            resumed = req_id in cached.resumed_req_ids
            for pending in (self.pending_loads, self.unsaved):
                if req_id in pending and new_blocks is not None:
                    (block_ids,) = new_blocks
                    pending[req_id].block_ids = list(block_ids) if resumed else [*pending[req_id].block_ids, *block_ids]
            if req_id in self.pending_loads and resumed:
                meta.loads.append(self.pending_loads.pop(req_id))
        scheduled = scheduler_output.num_scheduled_tokens
        for req_id in [r for r in self.unsaved if r in scheduled]:
            save = self.unsaved[req_id]
            if computed[req_id] + scheduled[req_id] >= save.tokens:
                del self.unsaved[req_id]
                if not save.path.exists():
                    meta.saves.append(save)
        return meta

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.pending_loads.pop(request.request_id, None)
        self.unsaved.pop(request.request_id, None)
        return False, None

    # ---- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.layers = kv_caches

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self.step = connector_metadata

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self.step = None

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        for load in self.step.loads if self.step else ():
            try:
                self.load(load)
            except (OSError, SafetensorError, KeyError, ValueError, RuntimeError) as error:
                logger.error("request %s: its stored KV %s cannot be loaded: %s", load.req_id, load.path, error)
                self.load_errors |= load.blocks(self.block_size)

    def load(self, load: PromptTransfer) -> None:
        stored = safetensors.torch.load_file(load.path)
        blocks, offsets = load.slots(self.block_size)
        for name, cache in self.layers.items():
            kv = stored[name]
            if kv.shape[0] != load.tokens or kv.shape[1:] != (2, *cache.shape[3:]):
                raise ValueError(f"layer {name} holds {tuple(kv.shape)}, not {load.tokens} positions of this pool")
            cache[blocks, :, offsets] = kv[load.skip :].to(cache.dtype)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        for save in self.step.saves if self.step else ():
            blocks, offsets = save.slots(self.block_size)
            self.saving.setdefault(save.path, {})[layer_name] = kv_layer[blocks, :, offsets].clone()

    def wait_for_save(self) -> None:
        saving, self.saving = self.saving, {}
        for path, layers in saving.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
            safetensors.torch.save_file(layers, partial)
            os.replace(partial, path)  # a file that exists is complete

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self.load_errors = self.load_errors, set()
        return errors
