"""vLLM's LoRA requests on the export's adapter slots (models/lora.py).

vLLM names an adapter by lora_int_id and path (LoRARequest). add_lora reads it on the host once (vLLM's
max_cpu_loras of them are kept, least recently used dropped first, pinned ones never); a scheduled request whose
adapter is not in a slot gets one: a free slot, else the least recently used slot no live request runs. That is a
copy of the adapter's weights into the slot, never a recompile. vLLM's scheduler keeps at most --max-loras distinct
adapters among running requests, and --max-loras is at most the export's slots (engine/refusals.py), so a
slot is always found.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.request import LoRARequest

from ...errors import InputError
from ...runtime import NeuronModelForCausalLM
from ...runtime.lora.peft_adapter import Adapter


class LoraSlots:
    def __init__(self, model: NeuronModelForCausalLM, max_cpu_loras: int) -> None:
        self.model, self.max_cpu_loras = model, max_cpu_loras
        self.host: OrderedDict[int, tuple[LoRARequest, Adapter]] = OrderedDict()  # least recently used first
        self.pinned: set[int] = set()

    # ---- the worker's LoRA interface --------------------------------------------------------------

    def add(self, request: LoRARequest) -> bool:
        """Reads the adapter (refused with what to change if the export cannot hold it) and keeps it on the host."""
        loaded = self.host.get(request.lora_int_id)
        if loaded is not None and loaded[0].lora_path == request.lora_path and not request.load_inplace:
            self.host.move_to_end(request.lora_int_id)
            return False
        if not Path(request.lora_path).exists():  # vLLM's error for it: 404 on /v1/load_lora_adapter
            raise LoRAAdapterNotFoundError(request.lora_name, request.lora_path)
        adapter = self.model.read_adapter(request.lora_path)
        self._drop_slot(request.lora_int_id)  # a reload in place: the slot's copy is stale
        self.host[request.lora_int_id] = (request, adapter)
        self._trim(keep=request.lora_int_id)
        return True

    def remove(self, lora_id: int) -> bool:
        if lora_id not in self.host:
            return False
        self._drop_slot(lora_id)
        del self.host[lora_id]
        self.pinned.discard(lora_id)
        return True

    def pin(self, lora_id: int) -> bool:
        if lora_id not in self.host:
            raise InputError(f"LoRA adapter {lora_id} is not loaded: load it before pinning it")
        self.pinned.add(lora_id)
        return True

    def ids(self) -> set[int]:
        return set(self.host)

    # ---- the runner's side ------------------------------------------------------------------------

    def slot(self, request: LoRARequest | None, live: Iterable[int]) -> int:
        """The slot request's adapter runs in (0: the base model), copied into one first if needed. `live`: the
        lora ids of every request that holds a batch row (their slots are kept)."""
        if request is None:
            return 0
        lora_id, name = request.lora_int_id, _name(request.lora_int_id)
        if lora_id not in self.host:
            self.add(request)
        self.host.move_to_end(lora_id)
        loaded = self.model.adapters
        if name in loaded:
            return loaded[name]
        free = self._free_slot(set(live) - {lora_id})
        return self.model.load_adapter(name, self.host[lora_id][1], slot=free)

    def _free_slot(self, live: set[int]) -> int:
        held = {slot: lora_id for lora_id in self.host if (slot := self.model.adapters.get(_name(lora_id)))}
        max_loras = self.model.neuron_config.max_loras
        free = [slot for slot in range(1, max_loras + 1) if slot not in held]
        if free:
            return free[0]
        for lora_id in self.host:  # least recently used first
            slot = self.model.adapters.get(_name(lora_id))
            if slot is not None and lora_id not in live:
                self.model.unload_adapter(_name(lora_id))
                return slot
        raise InputError(
            f"all {max_loras} LoRA slots run live requests' adapters: serve with --max-loras at most {max_loras}"
        )

    def _drop_slot(self, lora_id: int) -> None:
        if _name(lora_id) in self.model.adapters:
            self.model.unload_adapter(_name(lora_id))

    def _trim(self, keep: int) -> None:
        """Keeps max_cpu_loras adapters on the host: the least recently used unpinned ones not in a slot go first,
        never `keep` (the adapter just read: a request may be about to need it). While every other adapter sits in a
        slot the host holds one more; a later add trims it once a slot has given its adapter up."""
        for lora_id in list(self.host):
            if len(self.host) <= self.max_cpu_loras:
                return
            if lora_id != keep and lora_id not in self.pinned and _name(lora_id) not in self.model.adapters:
                del self.host[lora_id]


def _name(lora_id: int) -> str:
    """The runtime's name of vLLM's adapter lora_id (runtime adapter names are strings)."""
    return f"vllm-lora-{lora_id}"
