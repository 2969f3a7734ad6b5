"""A killed `optimum-cli export neuron` resumes: run again, it copies the graphs it had compiled and compiles only
the rest; `--compile-workers` is accepted and checked."""

from __future__ import annotations

import os
import signal
import subprocess

from optimum_neuron_plugin.backends.program_cache import CACHE_ENV

from .helpers import OPTIMUM_CLI, REPO, cli_env, leftovers, run_export

# Without the session's shared compile cache: every graph is compiled by these exports or reused from their own.
ENV = {CACHE_ENV: ""}
# Five graphs (one context bucket, two prefill buckets, 2-row decode): three compiled before the kill, two after.
SHAPE = (
    "--batch-size", "2", "--sequence-length", "64", "--prefill-chunk-size", "8", "--backend", "cpu",
    "--context-buckets", "64", "--prefill-buckets", "0,64", "--decode-batch-sizes", "2",
)  # fmt: skip


def test_a_killed_export_resumes_and_compiles_only_the_rest(tiny_llama, tmp_path):
    output = tmp_path / "out"
    command = [str(OPTIMUM_CLI), "export", "neuron", "--cpu-compiler", "export", "--model", str(tiny_llama), *SHAPE,
               "--compile-workers", "1", str(output)]  # fmt: skip
    first = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=cli_env(**ENV), cwd=REPO)
    compiled = 0
    for line in first.stdout:
        compiled += ": compiled in " in line
        if compiled == 3:
            os.kill(first.pid, signal.SIGKILL)
            break
    first.wait()
    first.stdout.close()
    assert first.returncode == -signal.SIGKILL and not output.exists()
    resume = tmp_path / ".out.compiled"
    assert len(list(resume.iterdir())) == 3

    second = run_export("--model", tiny_llama, *SHAPE, "--compile-workers", "1", output, env=cli_env(**ENV))
    assert second.returncode == 0, second.stderr
    lines = second.stdout.splitlines()
    reused = [line for line in lines if line.endswith("reused (compiled by an earlier export)")]
    fresh = [line for line in lines if ": compiled in " in line]
    total = len(reused) + len(fresh)
    assert len(reused) == 3 and total == 4 and f"{total} graphs" not in lines
    assert all(f"/{total}] graph " in line for line in reused + fresh)
    assert not resume.exists() and leftovers(tmp_path) == []


def test_compile_workers_must_be_positive(tiny_llama, tmp_path):
    done = run_export("--model", tiny_llama, *SHAPE, "--compile-workers", "0", tmp_path / "out")
    assert done.returncode == 1 and done.error_lines == [
        "error: --compile-workers 0 is not allowed: must be an integer >= 1"
    ]
