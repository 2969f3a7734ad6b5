"""Tensor-parallel export on TorchNeuron: one process per NeuronCore, each compiling every graph on its shard.

TorchNeuron compiles a graph at its first call, and the collectives of a sharded graph (models/collectives.py) name
a live process group, whose ranks TorchNeuron reads when it lowers them. So an export with tp_degree N starts N rank
processes (torch.multiprocessing, spawn). Rank r
- takes NeuronCore r (pin_cores) and joins the ranks' process group (rendezvous on a file in a scratch directory),
- slices its shard of the full weights (models/sharding.py) and builds the graphs on the live group's name,
- calls every graph once, in the same order as every other rank (NeuronBackend.compile with its Peers).
TorchNeuron's cache keys do not depend on the rank, so the ranks share the artifact's NEFF cache; rank 0 writes the
graph manifests. The exporting process never joins the group: it relays rank 0's progress and waits. When a rank
fails, the others are stopped and the export raises one ExportError with the first failure and its rank.
"""

from __future__ import annotations

import sys
import tempfile
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import ExportError
from ..graphs import DecoderGraph, graph_specs
from ..models import sharding
from ..models.args import ModelArgs
from ..models.collectives import Collectives
from ..models.kv_cache import empty_cache
from ..placement import Rank
from . import Progress, host_group
from .neuron import NeuronBackend, Peers, pin_cores

# A rank blocked this long in a collective or barrier fails (the parent then stops the others). It waits there
# while another rank is still compiling the same graph, so this is longer than one graph's compile.
RANK_TIMEOUT = timedelta(hours=1)


@dataclass(frozen=True)
class RankJob:
    """What every rank process is given."""

    backend: NeuronBackend
    args: ModelArgs
    cache_dtype: torch.dtype
    weights: Path  # the full weights, saved once by the parent; each rank slices its shard
    directory: Path  # where the graphs are compiled (the export's working directory)
    init_method: str  # the process group's rendezvous


def compile_on_ranks(
    backend: NeuronBackend, args: ModelArgs, params: dict, cache_dtype: torch.dtype, directory: Path, progress: Progress
) -> None:
    degree = backend.neuron_config.tp_degree
    with tempfile.TemporaryDirectory(prefix=".ranks-", dir=directory) as scratch:
        weights = Path(scratch) / "weights.pt"
        torch.save(params, weights)
        job = RankJob(backend, args, cache_dtype, weights, Path(directory), f"file://{scratch}/rendezvous")
        progress(f"compiling every graph on {degree} ranks, one process per NeuronCore")
        _run(job, degree, progress)


def _run(job: RankJob, degree: int, progress: Progress) -> None:
    """Starts the ranks and waits for all of them; a failure of any becomes one ExportError."""
    messages = mp.get_context("spawn").SimpleQueue()
    ranks = mp.start_processes(_rank_main, (job, degree, messages), nprocs=degree, join=False, start_method="spawn")
    failures: dict[int, str] = {}  # rank -> its failure, in the order they were reported
    try:
        while not ranks.join(timeout=1):  # raises when a rank exits with an error, after stopping the others
            _relay(messages, progress, failures)
        _relay(messages, progress, failures)
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as error:
        _relay(messages, progress, failures)
        raise ExportError(f"tensor-parallel export on {degree} ranks failed: {_cause(error, failures)}") from None
    finally:
        for process in ranks.processes:  # only when the export itself is interrupted
            if process.is_alive():
                process.kill()
                process.join()


def _relay(messages, progress: Progress, failures: dict[int, str]) -> None:
    while not messages.empty():
        kind, rank, text = messages.get()
        if kind == "progress":
            progress(text)
        else:
            failures.setdefault(rank, text)


def _cause(error: mp.ProcessExitedException | mp.ProcessRaisedException, failures: dict[int, str]) -> str:
    """A rank that stopped without a word (killed, crashed) is the cause; otherwise the first failure reported:
    the other ranks fail after it, when their peer leaves the group."""
    if error.error_index not in failures:
        return f"rank {error.error_index} stopped ({error}); see the log above"
    rank, text = next(iter(failures.items()))
    return f"rank {rank}: {text}"


def _rank_main(rank: int, job: RankJob, degree: int, messages) -> None:
    try:
        _compile_rank(rank, job, degree, messages)
    except BaseException as error:  # noqa: BLE001 - every failure reaches the parent as one line
        if not isinstance(error, ExportError):
            traceback.print_exc()
        text = " ".join(str(error).split())[:800] or type(error).__name__
        messages.put(("error", rank, text))
        sys.exit(1)


def _compile_rank(rank: int, job: RankJob, degree: int, messages) -> None:
    backend, args, nc = job.backend, job.args, job.backend.neuron_config
    if backend.device == "neuron":
        pin_cores(Rank(tp_rank=rank, tp_size=degree))
    backend.init_process_group(rank, degree, job.init_method, RANK_TIMEOUT)
    peers = Peers(rank, host_group(dist.group.WORLD))
    layout = sharding.layout_for(args, degree)
    shard = sharding.shard_params(torch.load(job.weights, mmap=True, weights_only=True), args, layout, rank)
    caches = empty_cache(
        args.num_hidden_layers, nc.num_blocks, nc.block_size, layout.kv_heads, args.head_dim, job.cache_dtype
    )
    cc = Collectives(degree, dist.group.WORLD.group_name)
    local = sharding.local_args(args, layout)
    graphs = [DecoderGraph(local, spec, nc.max_topk, cc) for spec in graph_specs(nc, args.vocab_size)]
    progress = (lambda message: messages.put(("progress", rank, message))) if rank == 0 else (lambda message: None)
    backend.compile(graphs, shard, caches, job.directory, progress, peers)
    dist.destroy_process_group()
