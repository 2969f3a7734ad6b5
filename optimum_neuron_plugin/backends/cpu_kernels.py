"""The CPU backend's C++ kernels (csrc/), built once per host with torch's extension builder and loaded by
`load()`, which registers each as the CPU implementation of its `onp::` op (models/attention.py, models/layers.py),
and the few-row linear `onp_cpu::rows_linear` that cpu_linear.py puts in the programs.
A registered C++ kernel is what makes a replayed program (cpu_script.py) call the op without returning to Python:
a kernel registered from Python takes the GIL on every call.

The build takes 15-60 s and lands in the environment (`<sys.prefix>/share/onp_cpu_kernels/<tree>`, or torch's
extension cache, TORCH_EXTENSIONS_DIR, where the environment is read-only): scripts/setup.sh builds it, a later
`load()` only links it (ninja rebuilds what changed). `<tree>` names the source checkout and the environment's path:
ninja's commands hold both, so checkouts installed in one environment would otherwise rebuild over each other.
On x86-64 the kernels compile for AVX2 and FMA when the host has them (every x86 server since 2013), and for AVX-512F
where the host has it (the chunk kernel's vectors are then 16 floats wide, csrc/chunk_tiles.h); elsewhere for the
compiler's default target.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

SOURCES = [
    Path(__file__).parent / "csrc" / name
    for name in ("decode_attention.cpp", "chunk_attention.cpp", "pointwise.cpp", "rows_linear.cpp")
]
NAME = "onp_cpu_kernels"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def compile_flags() -> list[str]:
    flags = ["-O3", "-fopenmp"]  # at::parallel_for is OpenMP in torch's CPU builds
    if platform.machine() in ("x86_64", "AMD64"):
        cpu = _cpu_flags()
        if {"avx2", "fma"} <= cpu:
            flags += ["-mavx2", "-mfma"]
        if "avx512f" in cpu:  # the chunk kernel's vectors: 16 floats wide (csrc/chunk_tiles.h)
            flags += ["-mavx512f"]
    return flags


def build_directory() -> Path | None:
    tree = hashlib.sha256(f"{SOURCES[0].parent}\0{sys.prefix}".encode()).hexdigest()[:12]
    directory = Path(sys.prefix) / "share" / NAME / tree
    if os.access(sys.prefix, os.W_OK):
        directory.mkdir(parents=True, exist_ok=True)
        return directory
    return None  # torch's extension cache


@contextlib.contextmanager
def _one_builder(directory: Path | None) -> Iterator[None]:
    """One process at a time builds or links in `directory`, under a lock the system releases when its holder dies.
    torch's own lock is a file that a build killed midway leaves behind, and every later load would wait on it
    forever: under this lock nobody else holds it, so a leftover one is removed."""
    if directory is None:
        yield
        return
    from ..torch_compat import cpp_extension_build_lock

    with open(directory / "onp_build.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        cpp_extension_build_lock(directory).unlink(missing_ok=True)
        yield


@cache
def load() -> None:
    """Build (first time on this host) and load the kernels: torch.ops.onp.* on CPU tensors then run them."""
    from torch.utils import cpp_extension

    from ..models import attention, layers  # noqa: F401 - the ops' definitions, before their kernels

    directory = build_directory()
    try:
        with _one_builder(directory):
            cpp_extension.load(
                NAME,
                [str(s) for s in SOURCES],
                extra_cflags=compile_flags(),
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory) if directory else None,
                is_python_module=False,
            )
    except (RuntimeError, OSError) as error:
        raise RuntimeError(
            f"building the CPU backend's C++ kernels ({', '.join(s.name for s in SOURCES)}) failed: {error}. They "
            "need a C++20 compiler (g++ 10 or later, or clang++) and ninja (`pip install ninja`); scripts/setup.sh installs ninja"
        ) from error


if __name__ == "__main__":
    load()
    print(f"{NAME}: built and loaded")
