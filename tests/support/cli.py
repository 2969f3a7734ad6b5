"""The real `optimum-cli export neuron` as a subprocess, for tests and session fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
OPTIMUM_CLI = VENV_BIN / "optimum-cli"
INFO_CLI = VENV_BIN / "neuron-plugin-info"


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def cli_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"})
    env.update(overrides)
    return env


def run_export(*args: object, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600):
    """Runs the real `optimum-cli export neuron ARGS` in a subprocess; with `--cpu-compiler export` unless
    ARGS choose one (C++ compilation costs seconds per graph; tests that need it ask for it)."""
    args = tuple(map(str, args))
    compiler = (
        () if any(a.startswith(("--cpu-compiler", "--cpu_compiler")) for a in args) else ("--cpu-compiler", "export")
    )
    command = [str(OPTIMUM_CLI), "export", "neuron", *compiler, *args]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env or cli_env(), cwd=cwd or REPO, timeout=timeout
    )
    return CliResult(done.returncode, done.stdout, done.stderr)
