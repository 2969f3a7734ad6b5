"""scripts/setup-neuron.sh --check on stand-in hosts: its platform check (x86_64, Ubuntu 26.04: SDK 2.33's
torch-neuronx wheels are built for it only) and its Python choice (3.12, 3.13 or 3.14: TorchNeuron 2.13.3's wheels).
The stand-ins are executables on PATH (uname, python3.x printing their version) and an os-release file."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "setup-neuron.sh"
UBUNTU_2604 = 'ID=ubuntu\nVERSION_ID="26.04"\nVERSION_CODENAME=resolute\n'
UBUNTU_2404 = 'ID=ubuntu\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\n'


def _host(tmp_path: Path, pythons: tuple[str, ...], arch: str = "x86_64", os_release: str = UBUNTU_2604) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "df", "tail", "tr"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    (bin_dir / "uname").write_text(f"#!/bin/sh\necho {arch}\n")
    for version in pythons:
        (bin_dir / f"python{version}").write_text(f"#!/bin/sh\necho {version}\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    (tmp_path / "os-release").write_text(os_release)
    return {"PATH": str(bin_dir), "OS_RELEASE": str(tmp_path / "os-release"), "HOME": str(tmp_path)}


def _check(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(env["PATH"]) / "bash"), str(SCRIPT), "--check"], capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize(("pythons", "picked"), [(("3.11", "3.13"), "python3.13"), (("3.12", "3.14"), "python3.12")])
def test_picks_the_first_supported_python(tmp_path, pythons, picked):
    done = _check(_host(tmp_path, pythons))
    assert done.returncode == 0, done.stderr
    assert f"platform: Ubuntu 26.04 x86_64; Python: {picked} ({picked[6:]})" in done.stdout


def test_refuses_a_host_without_a_supported_python(tmp_path):
    done = _check(_host(tmp_path, ("3.11",)))
    assert done.returncode == 1
    assert "no python3.12, python3.13 or python3.14 found" in done.stderr


def test_refuses_an_unsupported_python_given_by_name(tmp_path):
    env = {**_host(tmp_path, ("3.11", "3.13")), "PYTHON": "python3.11"}
    done = _check(env)
    assert done.returncode == 1
    assert (
        "PYTHON=python3.11 is Python 3.11: TorchNeuron 2.13.3 has wheels for Python 3.12, 3.13 and 3.14" in done.stderr
    )


@pytest.mark.parametrize(
    ("arch", "os_release", "message"),
    [
        ("aarch64", UBUNTU_2604, "this host is aarch64: trn2/trn3 instances are x86_64"),
        ("x86_64", UBUNTU_2404, "this host runs ubuntu 24.04: Neuron SDK 2.33's torch-neuronx wheels are built for "
         "Ubuntu 26.04 only"),
    ],
)  # fmt: skip
def test_refuses_other_platforms(tmp_path, arch, os_release, message):
    done = _check(_host(tmp_path, ("3.12",), arch, os_release))
    assert done.returncode == 1 and message in done.stderr


def test_check_host_fails_on_this_cpu_host_with_what_to_fix():
    """This host has Python 3.11, no torch-neuronx and no Neuron device: every problem is named with its fix."""
    done = subprocess.run(
        [str(Path(os.sys.executable).parent / "neuron-plugin-info"), "--check-host"],
        capture_output=True, text=True, env={**os.environ},
    )  # fmt: skip
    assert done.returncode == 1
    assert "torch 2.13.0" in done.stdout and "torch-neuronx not installed" in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert "error: torch-neuronx is not installed: run scripts/setup-neuron.sh (docs/neuron.md, step 2)" in errors
    assert any(line.startswith("error: no /dev/neuron* device") for line in errors)
    assert done.stderr.splitlines()[-1].startswith("this host is not ready for the neuron backend")
