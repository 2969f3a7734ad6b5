"""What every result folder records about its run: the commit, the command and the host, in RUN_DIR/run.json.

    .venv/bin/python benchmark/tools/record.py RUN_DIR -- COMMAND [ARGS...]

The drivers (graphs.py, served.py) call record(); the shell scenarios call this script first. The first record of a
folder sets its command (a scenario's, not the driver calls it makes); later ones add their keys. Also recorded: the
knobs (environment variables the benchmark scripts read) set for the run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def commit() -> str:
    """The checkout's short commit, with `-dirty` when tracked files differ from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def host() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    cpu = names[0] if names else "?"
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory, 1),
        "load_average": os.getloadavg()[0],
        "name": os.uname().nodename,
    }


def knobs() -> dict[str, str]:
    """The environment variables the benchmark's shell scripts read (`${NAME`), as set for this run."""
    names = set()
    for script in (REPO / "benchmark").glob("*.sh"):
        names.update(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", script.read_text()))
    return {name: os.environ[name] for name in sorted(names) if name in os.environ}


def record(run_dir: Path, command: list[str], **extra) -> Path:
    """Write (or complete) run_dir/run.json: the commit, the command line, the host and knobs, and `extra`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "run.json"
    run = json.loads(path.read_text()) if path.is_file() else {}
    run.setdefault("started", time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    if "command" not in run:
        run.update(commit=commit(), command=shlex.join(command), host=host(), knobs=knobs())
    run.update(**extra)
    path.write_text(json.dumps(run, indent=1) + "\n")
    return path


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    """A driver's own arguments and those after `--` (passed on to the case's script)."""
    if "--" not in argv:
        return argv, []
    split = argv.index("--")
    return argv[:split], argv[split + 1 :]


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--":
        raise SystemExit("usage: record.py RUN_DIR -- COMMAND [ARGS...]")
    print(record(Path(args[0]), args[2:]))


if __name__ == "__main__":
    main()
