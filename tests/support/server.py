"""`vllm serve` on 127.0.0.1 for the tests: one class, stopped by PID, never outliving the test process.

Engine processes start with fork (VLLM_WORKER_MULTIPROC_METHOD=fork, a setting vLLM's users may choose): a server
is ready in ~20 s of CPU instead of ~27 s with the plugin's default, spawn, whose child imports vLLM again. The
tests whose subject is the default start-up path pass `fork=False` and start their engine processes the way a
user's `vllm serve` does: tests/vllm/test_server.py (the OpenAI server and its engine process),
tests/vllm/test_data_parallel_server.py (two engine processes and the DP coordinator), and the runs that must
refuse to start (tests/reliability/helpers.py Refusals: a corrupt artifact fails to load in the engine process).

Each server runs in its own process group (stopping it reaches the engine process too) and gets SIGTERM
when the thread that started it ends (PR_SET_PDEATHSIG), so a test process killed before its fixtures'
teardown (SIGKILL, a CI timeout) leaves no server behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .client import HOST, health

VENV_BIN = Path(sys.executable).parent
VLLM = VENV_BIN / "vllm"
PR_SET_PDEATHSIG = 1
FORK = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}  # the engine processes' start method unless fork=False (see above)
# Resolved here, not in the forked child (which should run as little as possible before exec).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def die_with_test_process() -> None:
    """Popen preexec_fn: SIGTERM to the child when the thread that started it ends."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_env(**extra: str) -> dict[str, str]:
    """The test process's environment without its vLLM / plugin settings, plus the CPU backend.

    One intra-op thread: the tiny models' ops gain nothing from more, and on a shared host OpenMP
    threads waiting for each other make every graph call 10-20x slower (measured: decode 11 ms with
    one thread, 124 ms with two, under a load of 3 on 2 cores). No usage-stats report and no hub lookups.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "ONP_"))}
    quiet = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    return {**env, **quiet, "ONP_BACKEND": "cpu", "OMP_NUM_THREADS": "1", **extra}


def start_vllm_serve(
    model: Path,
    log: Path,
    port: int,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    fork: bool = True,
) -> subprocess.Popen:
    """`vllm serve MODEL --host 127.0.0.1 --port PORT ARGS` in the background, output to `log`; engine processes
    forked unless fork=False (the plugin's default, spawn)."""
    command = [str(VLLM), "serve", str(model), "--host", HOST, "--port", str(port), *args]
    with log.open("w") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=server_env(**(FORK if fork else {}), **(env or {})),
            start_new_session=True,
            preexec_fn=die_with_test_process,
        )


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to the process group of a server (and any engine process it left behind)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)


class Server:
    """`ONP_BACKEND=cpu vllm serve <dir> --host 127.0.0.1 --port N ARGS`, started at once, stopped by PID."""

    def __init__(
        self, model: Path, log: Path, *args: str, env: dict[str, str] | None = None, fork: bool = True
    ) -> None:
        self.model = str(model)
        self.port = free_port()
        self.log = log
        self.process = start_vllm_serve(model, log, self.port, args, env, fork)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}; log:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if health(self.port) == 200:
                    return
            time.sleep(0.25)
        raise TimeoutError(f"vllm serve not ready after {timeout} s; log:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text()[-chars:]

    def stop(self) -> int | None:
        """SIGTERM to the server's PID (vLLM stops its engine process), then SIGKILL to any straggler of its group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        kill_group(self.process)
        return self.process.returncode


def serve(
    model: Path, log: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300, fork: bool = True
):
    """Fixture body: a ready Server, stopped afterwards (`yield from serve(...)`)."""
    server = Server(model, log, *args, env=env, fork=fork)
    try:
        server.wait_ready(timeout)
        yield server
    finally:
        server.stop()
    assert server.process.poll() is not None
