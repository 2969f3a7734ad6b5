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

from ..config import NeuronConfig
from ..graphs import DecoderGraph, GraphSpec

Progress = Callable[[str], None]


def join_gloo_group(rank: int, world_size: int, init_method: str, timeout: timedelta) -> None:
    """The ranks' torch.distributed group when every collective runs on host tensors."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)


def neuron_devices_present() -> bool:
    return any(Path("/dev").glob("neuron[0-9]*"))


def resolve_backend(name: str) -> str:
    """`auto` picks neuron when Neuron devices are present, else cpu."""
    if name == "auto":
        return "neuron" if neuron_devices_present() else "cpu"
    return name


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
