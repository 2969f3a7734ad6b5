"""Compiling an export's graphs: in this process or in worker processes, reusing any graph already compiled.

- A graph is reused when the program cache (program_cache.py) holds an entry under its key: the graph, the shapes
  of its inputs, this package's graph code and the compiler's identity (version, flags, target). The export keeps
  such a cache beside its output until it is published, so an interrupted export resumes where it stopped.
- With workers > 1 the graphs left are compiled by that many spawned processes, each compiling whole graphs, one
  at a time, into the export's working directory (backend.worker_state, backend.compile_graph); the weights are
  saved once and memory-mapped by every worker. Each graph's files are the same whichever process compiled them.
- Progress: one line per graph with graphs done / total, the time per graph so far and an estimate of the time
  left.
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.multiprocessing as mp

from ..graphs import DecoderGraph, GraphSpec
from . import Progress
from .program_cache import ProgramCache

GIB = 1024**3


@dataclass(frozen=True)
class CompileOptions:
    workers: int = 1
    # Graphs compiled by an earlier, interrupted export of the same inputs (None: no reuse besides the global cache).
    resume_dir: Path | None = None


SERIAL = CompileOptions()


class PoolBackend(Protocol):
    shares_compile_cache: bool  # whether ONP_CPU_COMPILE_CACHE applies
    worker_bytes: int  # host memory one compile worker needs (default_workers)
    graphs_per_worker: int  # graphs a worker must have to pay for its start (default_workers)

    def compiler_identity(self) -> tuple:
        """What besides the graph decides the compiled bytes: compiler versions, flags, target."""

    def worker_state(self, graphs: list[DecoderGraph], params: dict, caches: list, directory: Path, worker: int):
        """Per-process state compile_graph needs (worker -1: the exporting process itself)."""

    def compile_graph(self, graph: DecoderGraph, state, directory: Path) -> list[str]:
        """Compiles one graph into directory; returns the files it wrote, relative to directory."""


def default_workers(per_worker_bytes: int, graphs: int, graphs_per_worker: int) -> int:
    """As many workers as the host's cores and available memory allow (each needs per_worker_bytes), and no more than
    one per graphs_per_worker graphs (a worker's start, a torch import and a weights load, must pay for itself)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, _available_memory() // max(per_worker_bytes, 1), graphs // graphs_per_worker))


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * GIB


def run(
    backend: PoolBackend,
    graphs: list[DecoderGraph],
    params: dict,
    caches: list[torch.Tensor],
    directory: Path,
    progress: Progress,
    options: CompileOptions = SERIAL,
) -> None:
    cache = ProgramCache.from_env(options.resume_dir, backend.shares_compile_cache)
    identity = backend.compiler_identity()
    keys = {g.spec: cache.key(g, params, caches, identity) for g in graphs}
    clock = _Clock(len(graphs), max(1, options.workers), progress)
    left = []
    for graph in graphs:
        if cache.fetch(keys[graph.spec], directory):
            clock.reused(graph.spec)
        else:
            left.append(graph)
    if not left:
        return
    # Tensor-parallel programs on the cpu backend are traced against this process's fake group: compiled here.
    workers = 1 if any(g.cc.degree > 1 for g in graphs) else min(options.workers, len(left))
    if workers > 1:
        progress(f"compiling {len(left)} graph(s) in {workers} worker processes")
        _run_workers(backend, graphs, params, caches, directory, left, workers, cache, keys, clock)
        return
    state = backend.worker_state(graphs, params, caches, directory, -1)
    for graph in left:
        start = time.monotonic()
        files = backend.compile_graph(graph, state, directory)
        cache.store(keys[graph.spec], directory, files)
        clock.compiled(graph.spec, time.monotonic() - start)


def _run_workers(backend, graphs, params, caches, directory, left, workers, cache, keys, clock) -> None:
    with tempfile.TemporaryDirectory(prefix=".compile-workers-", dir=directory) as scratch:
        weights = Path(scratch) / "weights.pt"
        torch.save(params, weights)
        context = mp.get_context("spawn")
        slots = context.Queue()
        for index in range(workers):
            slots.put(index)
        specs = [g.spec for g in graphs]
        shapes = [(tuple(c.shape), c.dtype) for c in caches]
        init = (backend, [g.args for g in graphs], specs, [g.max_topk for g in graphs], weights, shapes, directory)
        with ProcessPoolExecutor(
            workers, mp_context=context, initializer=_init_worker, initargs=(*init, slots)
        ) as pool:
            pending = {pool.submit(_compile_in_worker, g.spec) for g in left}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        spec, seconds, files = future.result()
                        cache.store(keys[spec], directory, files)
                        clock.compiled(spec, seconds)
            except BaseException:
                for future in pending:
                    future.cancel()
                raise


_WORKER: dict = {}


def _init_worker(backend, args_list, specs, topks, weights, cache_shapes, directory, slots) -> None:
    index = slots.get()
    params = torch.load(weights, mmap=True, weights_only=True)
    caches = [torch.zeros(shape, dtype=dtype) for shape, dtype in cache_shapes]
    graphs = [DecoderGraph(args, spec, topk) for args, spec, topk in zip(args_list, specs, topks, strict=True)]
    _WORKER.update(
        backend=backend,
        graphs={g.spec: g for g in graphs},
        directory=directory,
        state=backend.worker_state(graphs, params, caches, directory, index),
    )


def _compile_in_worker(spec: GraphSpec) -> tuple[GraphSpec, float, list[str]]:
    start = time.monotonic()
    graph = _WORKER["graphs"][spec]
    files = _WORKER["backend"].compile_graph(graph, _WORKER["state"], _WORKER["directory"])
    return spec, time.monotonic() - start, files


class _Clock:
    """Progress lines: graphs done / total, time per compiled graph so far, time left at that pace."""

    def __init__(self, total: int, workers: int, progress: Progress) -> None:
        self.total, self.workers, self.progress = total, workers, progress
        self.done, self.compile_seconds, self.compiles = 0, 0.0, 0

    def reused(self, spec: GraphSpec) -> None:
        self.done += 1
        self.progress(f"[{self.done}/{self.total}] graph {spec.key}: reused (compiled by an earlier export)")

    def compiled(self, spec: GraphSpec, seconds: float) -> None:
        self.done += 1
        self.compiles += 1
        self.compile_seconds += seconds
        per_graph = self.compile_seconds / self.compiles
        left = per_graph * (self.total - self.done) / self.workers
        self.progress(
            f"[{self.done}/{self.total}] graph {spec.key}: compiled in {seconds:.1f} s "
            f"({per_graph:.1f} s per graph so far, about {_duration(left)} left)"
        )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
