"""A stand-in for TorchNeuron's Dynamo backend, for hosts without the Neuron SDK.

Importing this module registers two Dynamo backends and a torch.distributed backend, so a process started by the
product (a rank of a tensor-parallel export) gets them through NeuronBackend(compiler_module=MODULE), without any
patching:
- FAKE: compiles like FakeNeuronCompiler (one "NEFF" file per distinct graph in the cache TorchNeuron would use);
- FAILS_ON_RANK_1: the same, but the compile raises in the process of torch.distributed rank 1;
- FAKE_PROCESS_GROUP: FakeNeuronProcessGroup, standing in for TorchNeuron's "neuron" process group backend.
With LOG_ENV set to a file, every compile appends "<rank> <key> compiled|hit" to it (rank processes cannot return
the in-memory lists).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions, ProcessGroup

from optimum_neuron_plugin.backends.neuron import CACHE_ENV
from optimum_neuron_plugin.torch_compat import register_compile_backend

MODULE = __name__
FAKE = "fake_neuron"
FAILS_ON_RANK_1 = "fake_neuron_fails_on_rank_1"
LOG_ENV = "ONP_TEST_COMPILE_LOG"
FAILURE = "fake neuronx-cc failure on rank 1"
FAKE_PROCESS_GROUP = "fake_neuron_pg"
HOST_TENSOR_REFUSED = "a host tensor reached the Neuron process group"


@dataclass(eq=False)  # hashable: Dynamo's registry keys on the function
class FakeNeuronCompiler:
    """Stands in for TorchNeuron's Dynamo backend: one "NEFF" per distinct graph in the persistent cache
    directory TorchNeuron reads from CACHE_ENV, a cache hit when the file is there; runs the graph eagerly."""

    fail_on_rank: int | None = None
    # TorchNeuron's NEFF cache is process-wide: it reads CACHE_ENV once, when it is created (NeuronResourceManager's
    # CompilationCache -> PersistentCacheBackend(), csrc/core/compilation/CompilationCache.cpp). A directory here models
    # a cache created before the backend set the variable; None reads the variable at each compile.
    cache_dir: Path | None = None
    compiled: list[str] = field(default_factory=list)
    hits: list[str] = field(default_factory=list)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank == self.fail_on_rank:
            raise RuntimeError(FAILURE)
        signature = [(tuple(x.shape), str(x.dtype)) for x in example_inputs if isinstance(x, torch.Tensor)]
        key = hashlib.sha256((gm.code + repr(signature)).encode()).hexdigest()
        path = Path(self.cache_dir or os.environ[CACHE_ENV]) / key[:2] / f"{key}.neff"
        what = "hit" if path.is_file() else "compiled"
        if what == "compiled":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(gm.code)
        (self.hits if what == "hit" else self.compiled).append(key)
        if os.environ.get(LOG_ENV):
            with open(os.environ[LOG_ENV], "a") as log:
                log.write(f"{rank} {key} {what}\n")
        return gm.forward


class FakeNeuronProcessGroup(ProcessGroup):
    """Stands in for TorchNeuron's ProcessGroupNeuron (torch_neuronx/distributed/backend.py) in what the plugin relies on:
    - it is a Python subclass of ProcessGroup, so torch makes it the whole group, whatever else the init string names
      (torch 2.13 distributed_c10d._new_process_group_helper: "If the type is a subclass of ProcessGroup then return
      this process group immediately");
    - the graphs' functional collectives (all_reduce, all_gather_into_tensor) work on it: TorchNeuron registers them
      for the "neuron" device; here the graphs run on the cpu device, so they go to a gloo backend of the same ranks,
      called from Python as ProcessGroupNeuron's are (torch's C++ fallback for a Python group would enqueue on gloo
      holding the GIL, which deadlocks with gloo's worker thread releasing a finished work's tensors);
    - a host-side collective called on it (dist.broadcast of a sampled token) is refused: ProcessGroupNeuron has no
      host path (its broadcast runs as a device all-reduce, _device_types is [neuron])."""

    def __init__(self, store, rank: int, size: int, timeout) -> None:
        super().__init__(rank, size)
        self._device_collectives = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, self._device_collectives)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return FAKE_PROCESS_GROUP

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def allreduce(self, tensors, opts=None):
        return self._device_collectives.allreduce(tensors, opts or AllreduceOptions())

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        # What the functional all_gather_into_tensor calls; gloo's Python binding has the one-pair form only.
        works = [
            self._device_collectives._allgather_base(o, i, opts or AllgatherOptions())
            for o, i in zip(outputs, inputs, strict=True)
        ]
        for work in works[:-1]:
            work.wait()
        return works[-1]

    def broadcast(self, tensors, opts=None):
        raise RuntimeError(f"{HOST_TENSOR_REFUSED} (broadcast of a {tensors[0].device} tensor)")


register_compile_backend(FakeNeuronCompiler(), FAKE)
register_compile_backend(FakeNeuronCompiler(fail_on_rank=1), FAILS_ON_RANK_1)


def read_log(path: Path) -> list[tuple[int, str, str]]:
    """(rank, graph key, "compiled" or "hit") per compile, in order."""
    if not path.is_file():
        return []
    return [(int(rank), key, what) for rank, key, what in (line.split() for line in path.read_text().splitlines())]


if FAKE_PROCESS_GROUP.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(FAKE_PROCESS_GROUP, FakeNeuronProcessGroup, devices=["cpu"])
