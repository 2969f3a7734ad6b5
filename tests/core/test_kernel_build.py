"""The CPU kernels load after a build killed midway: the build lock torch leaves behind in the build directory does
not make every later start wait forever (backends/cpu_kernels.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from optimum_neuron_plugin.backends import cpu_kernels
from optimum_neuron_plugin.torch_compat import cpp_extension_build_lock


def test_a_build_lock_left_by_a_killed_build_does_not_hang_the_next_load():
    directory = cpu_kernels.build_directory()
    if directory is None:
        pytest.skip("a read-only environment builds in torch's extension cache")
    cpp_extension_build_lock(directory).touch()  # what a build killed while holding torch's lock leaves
    command = [sys.executable, "-m", "optimum_neuron_plugin.backends.cpu_kernels"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "built and loaded" in done.stdout, done.stderr[-2000:]
    assert not cpp_extension_build_lock(directory).exists()
