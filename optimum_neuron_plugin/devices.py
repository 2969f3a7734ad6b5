"""Whether this host has Neuron devices, which instance type they are, and the instance type a neuron export compiles
for (resolve_target: --instance-type, else this host's; it sets the FP8 range, trn2's FP8 compiler option and the HBM
the memory plan counts). The rules every part of the project asks; imports no torch.

The Neuron driver creates one /dev/neuron<N> node per device; a container may be given any subset of them
(e.g. only /dev/neuron3), so any such node counts.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

from .config import NeuronConfig
from .errors import ExportError


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


NOT_NEURON = "this host is not a Neuron instance (no /dev/neuron* device or no torch-neuronx)"


def resolve_target(neuron_config: NeuronConfig) -> NeuronConfig:
    """A neuron config without a target takes this host's instance type. FP8 graphs are refused when neither the
    config nor the host says which instance type it is; other graphs keep no target (the memory plan then assumes
    trn2, the smaller chip, and says so)."""
    nc = neuron_config
    if nc.backend != "neuron" or nc.target is not None:
        return nc
    try:
        host, why = host_instance_type(), NOT_NEURON
    except HostQueryError as error:
        host, why = None, str(error)
    if host is not None:
        return replace(nc, target=host)
    if nc.quantization or nc.kv_cache_dtype:
        raise ExportError(
            "FP8 graphs (--quantize fp8, --kv-cache-dtype fp8 or an FP8 checkpoint) on the neuron backend depend on "
            f"the instance type (trn2's FP8 holds +-240, trn3's +-448, and trn2 needs a compiler option), and {why}: "
            "pass --instance-type trn2|trn3 (NeuronConfig target=)"
        )
    return nc
