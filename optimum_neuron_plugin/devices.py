"""Whether this host has Neuron devices: the one rule every part of the project asks.

The Neuron driver creates one /dev/neuron<N> node per device; a container may be given any subset of them
(e.g. only /dev/neuron3), so any such node counts.
"""

from __future__ import annotations

from pathlib import Path


def neuron_devices_present(dev: Path = Path("/dev")) -> bool:
    return any(dev.glob("neuron[0-9]*"))


def resolve_backend(name: str) -> str:
    """`auto` picks neuron when Neuron devices are present, else cpu."""
    if name == "auto":
        return "neuron" if neuron_devices_present() else "cpu"
    return name
