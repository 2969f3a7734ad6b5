"""The collectives inside the graphs: torch.distributed functional collectives on a group named in the graph.

Functional collectives (torch.ops._c10d_functional) are ordinary ops with a result: torch.export records them
in the program with the group's name as a string argument, and TorchNeuron's Dynamo backend lowers them to
its native collectives (its collective_legalization pass turns the group name into replica groups). With
`Collectives(degree=1)` every function is the identity and the graph holds no collective at all.

At export no ranks exist: `export_world(degree)` initialises a fake process group of that size in the exporting
process, so the program records "all-reduce over the group named '0' of `degree` ranks"; the CPU backend
rebinds that name to the live group at load (backends/cpu.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import torch_compat

# The c10d functional ops that carry a group name as their last argument.
GROUP_OPS = torch_compat.group_collective_ops()


@dataclass(frozen=True)
class Collectives:
    degree: int = 1
    group: str | None = None  # the process group's name (dist.ProcessGroup.group_name)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks."""
        return x if self.degree == 1 else torch_compat.functional_all_reduce_sum(x, self.group)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[n, c] on each rank -> [n, degree * c], rank 0's columns first."""
        if self.degree == 1:
            return x
        n, c = x.shape
        gathered = torch_compat.functional_all_gather(x.contiguous(), 0, self.group)  # [degree * n, c]
        return gathered.view(self.degree, n, c).permute(1, 0, 2).reshape(n, self.degree * c)


# One rank, no collectives: the graphs as without tensor parallelism.
SINGLE = Collectives()


@contextmanager
def export_world(degree: int) -> Iterator[str]:
    """A fake process group of `degree` ranks for tracing the graphs; yields its name."""
    torch_compat.init_fake_process_group(degree)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()
