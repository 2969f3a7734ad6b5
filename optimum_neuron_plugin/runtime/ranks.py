"""Tensor-parallel ranks as the runtime sees them: the default group, and rank 0's host values on every rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..backends import host_group
from ..errors import ArtifactError, InputError
from ..graphs import GraphSpec


def tp_group(degree: int) -> dist.ProcessGroup | None:
    """The default process group for tp_degree `degree`: the torch.distributed world (None for degree 1 or when
    torch.distributed is not initialised); a world of another size is refused."""
    if degree == 1 or not dist.is_initialized():
        return None
    if dist.get_world_size() != degree:
        raise ArtifactError(
            f"tp_degree={degree} but the torch.distributed world has {dist.get_world_size()} processes: start "
            f"{degree} processes, or pass the tensor-parallel group"
        )
    return dist.group.WORLD


def from_rank0(group: dist.ProcessGroup | None, tensor: torch.Tensor) -> torch.Tensor:
    """Rank 0's value on every rank: host-drawn randomness (and what it sampled) must agree across ranks. A host
    tensor: it goes over the group's host group (gloo), not over a device's group such as TorchNeuron's."""
    if group is not None:
        host = host_group(group)
        dist.broadcast(tensor, src=dist.get_global_rank(host, 0), group=host)
    return tensor


class NoRanks:
    """The graphs of a tp_degree > 1 model outside a process group (the export process): saved, never run."""

    def __init__(self, degree: int) -> None:
        self.degree = degree

    def __call__(self, spec: GraphSpec, *inputs: torch.Tensor) -> torch.Tensor:
        raise InputError(
            f"this model is sharded over tp_degree={self.degree} ranks: save it, then load it with from_pretrained in "
            f"each of {self.degree} processes of a torch.distributed group"
        )
