"""Whether this host has Neuron devices, and which instance type they are: the rules every part of the project asks.

The Neuron driver creates one /dev/neuron<N> node per device; a container may be given any subset of them
(e.g. only /dev/neuron3), so any such node counts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


class HostQueryError(RuntimeError):
    """TorchNeuron could not say which instance type this host is; the message says why."""


def neuron_devices_present(dev: Path = Path("/dev")) -> bool:
    return any(dev.glob("neuron[0-9]*"))


def resolve_backend(name: str) -> str:
    """`auto` picks neuron when Neuron devices are present, else cpu."""
    if name == "auto":
        return "neuron" if neuron_devices_present() else "cpu"
    return name


def host_instance_type() -> str | None:
    """The instance type TorchNeuron compiles for on this host ("trn2", "trn3"): what the Neuron runtime reports
    (torch_neuronx.utils.get_platform_target, which does not start the runtime). None on a host without Neuron
    devices or without torch-neuronx; HostQueryError when TorchNeuron is there but cannot answer."""
    if not neuron_devices_present() or importlib.util.find_spec("torch_neuronx") is None:
        return None
    try:
        from torch_neuronx.utils import get_platform_target

        return str(get_platform_target())
    except Exception as error:  # a C++ extension's failure may surface as any exception type
        raise HostQueryError(
            f"torch-neuronx could not read this host's instance type ({type(error).__name__}: {error})"
        ) from None
