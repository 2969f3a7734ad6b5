"""Helpers shared by the CLI tests: paths, the `optimum-cli` subprocess runner, leftover detection."""

from __future__ import annotations

from pathlib import Path

from support.cli import INFO_CLI, OPTIMUM_CLI, REPO, VENV_BIN, CliResult, cli_env, export_in_process, run_export

__all__ = [
    "INFO_CLI",
    "OPTIMUM_CLI",
    "REPO",
    "VENV_BIN",
    "CliResult",
    "cli_env",
    "export_in_process",
    "leftovers",
    "run_export",
]


def leftovers(parent: Path) -> list[str]:
    """Hidden staging/backup directories an export may have left beside its output."""
    return sorted(
        p.name for p in parent.iterdir() if p.name.startswith(".") and (".partial-" in p.name or ".old-" in p.name)
    )
