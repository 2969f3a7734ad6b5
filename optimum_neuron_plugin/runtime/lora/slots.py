"""AdapterSlots: which LoRA adapter each slot of an export holds and which slot each sequence runs (models/lora.py).

Loading an adapter copies its weights into its slot of the stacked A/B the graphs take (this rank's shard under
tensor parallelism); unloading zeroes the slot. Slot 0 is the base model and never holds an adapter.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ...config import NeuronConfig
from ...errors import InputError
from ...graph_inputs import INDEX_DTYPE
from ...models import lora, sharding
from ...models.args import ModelArgs
from . import peft_adapter


class AdapterSlots:
    def __init__(self, neuron_config: NeuronConfig) -> None:
        self.neuron_config = neuron_config
        self.names: list[str | None] = [None] * (neuron_config.max_loras + 1)  # slot -> adapter name
        self.of_seq = torch.zeros(neuron_config.batch_size, dtype=INDEX_DTYPE)  # seq_id -> slot

    @property
    def loaded(self) -> dict[str, int]:
        """Adapter name -> slot."""
        return {name: slot for slot, name in enumerate(self.names) if name is not None}

    def rows(self, seq_ids: Sequence[int]) -> torch.Tensor | None:
        """The adapter slot input of rows running seq_ids (None: the export has no LoRA slots)."""
        return self.of_seq[list(seq_ids)] if self.neuron_config.lora else None

    def slot(self, name: str | None) -> int:
        """The slot of adapter `name` (None: the base model, slot 0)."""
        if name is None:
            return 0
        self._require_lora()
        if name not in self.loaded:
            known = ", ".join(self.loaded) or "none"
            raise InputError(f"adapter {name!r} is not loaded (loaded: {known}); load it with load_adapter first")
        return self.loaded[name]

    def assign(self, seq_id: int, name: str | None) -> None:
        self.of_seq[seq_id] = self.slot(name)

    def read(self, path: str | Path, args: ModelArgs) -> peft_adapter.Adapter:
        """The PEFT adapter at `path` in slot layout, checked against the export (peft_adapter.py)."""
        self._require_lora()
        return peft_adapter.read(path, args, self.neuron_config)

    def load(
        self, params: dict, args: ModelArgs, layout: sharding.ShardLayout, rank: int, name: str,
        adapter: str | Path | peft_adapter.Adapter, slot: int | None = None,
    ) -> int:  # fmt: skip
        """Copies `adapter` (or the PEFT adapter at that path) into `slot` (default: the first free one); returns
        the slot."""
        self._require_lora()
        if name in self.loaded:
            raise InputError(f"an adapter named {name!r} is already loaded (slot {self.loaded[name]}): unload it first")
        if not isinstance(adapter, peft_adapter.Adapter):
            adapter = self.read(adapter, args)  # a bad adapter is refused first
        slot = self._free_slot() if slot is None else slot
        if not 1 <= slot <= self.neuron_config.max_loras or self.names[slot] is not None:
            raise InputError(f"LoRA slot {slot} is not free: slots are 1..{self.neuron_config.max_loras}")
        self._zero(params, slot)
        for projection, (a, b) in adapter.weights.items():
            for suffix, tensor in ((lora.A, a), (lora.B, b)):
                stack = params[projection + suffix]
                full = tensor[None].to(stack.dtype)
                stack[slot].copy_(sharding.lora_shard(projection + suffix, full, args, layout, rank)[0])
        self.names[slot] = name
        return slot

    def unload(self, params: dict, name: str) -> int:
        """Zeroes the slot of adapter `name`; refused while a sequence runs it. Returns the slot."""
        slot = self.slot(name)
        users = (self.of_seq == slot).nonzero().flatten().tolist()
        if users:
            raise InputError(
                f"adapter {name!r} is in use by sequence(s) {users}: set_adapter(seq_id, None) before unloading it"
            )
        self._zero(params, slot)
        self.names[slot] = None
        return slot

    def _zero(self, params: dict, slot: int) -> None:
        for name, stack in params.items():
            if lora.is_slot_stack(name):
                stack[slot].zero_()

    def _free_slot(self) -> int:
        for slot in range(1, len(self.names)):
            if self.names[slot] is None:
                return slot
        raise InputError(
            f"all {self.neuron_config.max_loras} LoRA slots hold adapters ({', '.join(self.loaded)}): unload one, or "
            "export again with a larger --max-loras"
        )

    def _require_lora(self) -> None:
        if not self.neuron_config.lora:
            raise InputError(
                "this export has no LoRA slots: export it again with --max-loras N --max-lora-rank R to serve adapters"
            )
