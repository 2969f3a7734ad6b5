"""What only the reliability tests need: the server's memory, and `vllm serve` runs that must refuse to start.

Requests, streams and aborts are support.client's; the server class is support.server's.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
from support.server import free_port, kill_group, start_vllm_serve


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (API server + engine core + helpers)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


@dataclass
class RssSampler:
    """Samples tree_rss(pid) every `interval` s in a thread while used as a context manager."""

    pid: int
    interval: float = 0.25
    max_rss: int = 0
    samples: int = 0

    def __enter__(self) -> RssSampler:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._sample()
        self._thread.start()
        return self

    def _sample(self) -> None:
        self.max_rss = max(self.max_rss, tree_rss(self.pid))
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()


# ---- servers that must refuse to start --------------------------------------------------------


@dataclass
class Refusal:
    returncode: int | None
    output: str
    seconds: float
    timed_out: bool


class Refusals:
    """`vllm serve` runs that must exit by themselves, started in the background (`workers` at a time).

    Each case is (model dir, extra args); result(name) waits for that run and returns its exit status
    and output. A run still alive after `timeout` s is killed by PID (its own process group) and
    reported as timed out.
    """

    def __init__(self, cases: dict[str, tuple[Path, list[str]]], logs: Path, workers: int = 2, timeout: float = 300):
        logs.mkdir(parents=True, exist_ok=True)
        self.logs, self.timeout = logs, timeout
        self._processes: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._futures = {name: self._pool.submit(self._run, name, *case) for name, case in cases.items()}

    def _run(self, name: str, model: Path, args: list[str]) -> Refusal:
        log = self.logs / f"{name}.log"
        began = time.monotonic()
        # Started from a pool thread, which lives until close(): the run outlives no test process.
        # Spawned engine processes, as a user's `vllm serve`: a startup failure is reported the default way.
        process = start_vllm_serve(model, log, free_port(), tuple(args), fork=False)
        with self._lock:
            self._processes.append(process)
        timed_out = False
        try:
            process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        kill_group(process)  # and any engine process it left behind
        return Refusal(process.returncode, log.read_text(), time.monotonic() - began, timed_out)

    def result(self, name: str) -> Refusal:
        return self._futures[name].result(timeout=self.timeout + 60)

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        with self._lock:
            for process in self._processes:
                if process.poll() is None:
                    kill_group(process)
        self._pool.shutdown(wait=True)
