"""LoRA adapters at run time: PEFT directories read into the slot layout (peft_adapter.py) and the slots each
sequence runs (slots.py); the graphs' side is models/lora.py."""

from .slots import AdapterSlots

__all__ = ["AdapterSlots"]
