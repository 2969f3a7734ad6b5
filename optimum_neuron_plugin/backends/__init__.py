"""Compile backends, one object each, chosen once per artifact from neuron_config.backend.

- cpu    (backends/cpu.py): each graph exported with torch.export and compiled to C++ with AOTInductor
         (or kept as the exported program), run on the host.
- neuron (backends/neuron.py): the same graphs compiled for NeuronCores by the Neuron SDK.

A backend compiles the graphs into an artifact directory, lists the files it wrote, and loads them
back as one callable `graphs(spec, *inputs) -> output` that owns the weights and the KV cache.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from ..config import NeuronConfig
from ..devices import neuron_devices_present  # noqa: F401 (backends/neuron.py imports it from here)
from ..graphs import DecoderGraph, GraphSpec

Progress = Callable[[str], None]


# Group name -> the gloo group for host tensors among that group's ranks, when the group itself is a device's
# (TorchNeuron's "neuron" group carries device tensors only).
_HOST_GROUPS: dict[str, dist.ProcessGroup] = {}


def join_gloo_group(rank: int, world_size: int, init_method: str, timeout: timedelta) -> None:
    """The ranks' torch.distributed group when every collective runs on host tensors."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
    _HOST_GROUPS.pop(dist.group.WORLD.group_name, None)


def join_device_group(backend: str, rank: int, world_size: int, init_method: str, timeout: timedelta) -> None:
    """The ranks' group on a device's collective backend, and a gloo group beside it for host tensors.

    One group cannot hold both ("cpu:gloo,neuron:neuron"): torch 2.13 makes a backend that is a ProcessGroup
    subclass, as TorchNeuron's ProcessGroupNeuron is, the whole group (distributed_c10d._new_process_group_helper),
    so host tensors would reach the device backend."""
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
    _HOST_GROUPS[dist.group.WORLD.group_name] = dist.new_group(backend="gloo")


def host_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """Where host tensors of `group`'s ranks go (broadcasts of sampled tokens, barriers): the gloo group made beside
    a device group (join_device_group), else the group itself."""
    return _HOST_GROUPS.get(group.group_name, group)


class LoadedGraphs(Protocol):
    def __call__(self, spec: GraphSpec, *inputs: torch.Tensor) -> torch.Tensor: ...


class Backend(Protocol):
    name: str
    # Tensor-parallel graphs are compiled for a live process group, one process per rank
    # (backends/neuron_ranks.py), instead of traced once against a fake group.
    compiles_on_live_ranks: bool

    def check_can_compile(self) -> None:
        """Fail before any weight is loaded when this host cannot compile (e.g. the SDK is absent)."""

    def compile(
        self, graphs: list[DecoderGraph], params: dict, caches: list[torch.Tensor], directory: Path, progress: Progress
    ) -> None:
        """Compile every graph into directory (the artifact being written)."""

    def graph_files(self, directory: Path, specs: list[GraphSpec]) -> list[Path]:
        """The files holding the compiled specs."""

    def load(
        self, graphs: list[DecoderGraph], params: dict, caches: list[torch.Tensor], directory: Path
    ) -> LoadedGraphs:
        """The compiled form of each graph, ready to call; they share params and caches."""

    def versions(self) -> dict:
        """What compiled the graphs, recorded in neuron_config.json."""

    def init_process_group(self, rank: int, world_size: int, init_method: str, timeout: timedelta) -> None:
        """Joins the torch.distributed group of the tensor-parallel ranks with the backend its collectives need."""


# How the runtime gets its backend from an artifact's NeuronConfig (tests pass one building a stand-in compiler).
BackendFactory = Callable[[NeuronConfig], Backend]


def get_backend(neuron_config: NeuronConfig) -> Backend:
    if neuron_config.backend == "neuron":
        from .neuron import NeuronBackend

        return NeuronBackend(neuron_config)
    from .cpu import CpuBackend

    return CpuBackend(neuron_config)
