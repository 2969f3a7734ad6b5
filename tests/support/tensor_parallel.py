"""Tensor-parallel ranks for tests: `degree` processes in a gloo group on 127.0.0.1, one torch thread each.

`run_ranks(worker, degree, *args)` starts the ranks (spawned by default), each runs worker(rank, *args) inside the
initialised group; results travel through files (torch.save), not queues: a spawned rank's shared-memory tensors
die with it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker: Callable[..., None], degree: int, *args: object, start_method: str = "spawn") -> None:
    """start_method "fork": the ranks inherit the modules the caller imported instead of importing them again."""
    mp.start_processes(
        _rank, args=(worker, degree, free_port(), args), nprocs=degree, join=True, start_method=start_method
    )


def _rank(rank: int, worker: Callable[..., None], degree: int, port: int, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=degree, timeout=timedelta(minutes=5)
    )
    try:
        worker(rank, *args)
    finally:
        dist.destroy_process_group()


def merge_kv_shards(shards: list[torch.Tensor], kv_replicas: int) -> torch.Tensor:
    """One layer cache [num_blocks, block_size, kv_heads, D] from the ranks' shards: each KV head once (replicated
    heads from the first rank holding them), in head order."""
    return torch.cat(shards[::kv_replicas], dim=2)
