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


def export_in_process(*args: object) -> CliResult:
    """The command `run_export` runs, called in this process: what `optimum-cli export neuron ARGS` does after it
    has parsed ARGS (exporter.export.run), its exit code and what it printed. For refusals that are found only by
    reading the model (torch and transformers imported: seconds per subprocess); the subprocess tests cover the
    command's start and its cheap checks."""
    import contextlib
    import io

    from transformers.utils import logging as hf_logging

    from exporter.cli import build_parser
    from exporter.export import run

    args = tuple(map(str, args))
    compiler = () if any(a.startswith("--cpu-compiler") for a in args) else ("--cpu-compiler", "export")
    parsed = build_parser().parse_args([*compiler, *args])
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env, saved_verbosity = dict(os.environ), hf_logging.get_verbosity()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = run(parsed)
    os.environ.clear()  # the command quiets transformers' logging, through the environment too
    os.environ.update(saved_env)
    hf_logging.set_verbosity(saved_verbosity)
    return CliResult(code, stdout.getvalue(), stderr.getvalue())
