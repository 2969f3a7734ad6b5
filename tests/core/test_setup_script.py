"""scripts/setup-neuron.sh --check on stand-in hosts: its platform check (x86_64, Ubuntu 26.04: SDK 2.33's
torch-neuronx wheels are built for it only), its Python choice (3.12, 3.13 or 3.14: TorchNeuron 2.13.3's wheels) and,
with --apt, the system packages it installs and its driver check. The stand-ins are executables on PATH (uname,
python3.x printing their version, sudo, apt-get recording its arguments, ...), an os-release file and a /dev directory.
Its pins agree with pyproject.toml's neuron extra and with --check-host's expected versions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from exporter.host_check import EXPECTED

SCRIPT = Path(__file__).parents[2] / "scripts" / "setup-neuron.sh"
UBUNTU_2604 = 'ID=ubuntu\nVERSION_ID="26.04"\nVERSION_CODENAME=resolute\n'
UBUNTU_2404 = 'ID=ubuntu\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\n'


def _host(tmp_path: Path, pythons: tuple[str, ...], arch: str = "x86_64", os_release: str = UBUNTU_2604) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "df", "tail", "tr", "cat", "ls", "wc"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    (bin_dir / "uname").write_text(f'#!/bin/sh\n[ "$1" = -r ] && echo 7.0.0-1001-aws || echo {arch}\n')
    for version in pythons:
        (bin_dir / f"python{version}").write_text(f"#!/bin/sh\necho {version}\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    (tmp_path / "os-release").write_text(os_release)
    return {"PATH": str(bin_dir), "OS_RELEASE": str(tmp_path / "os-release"), "HOME": str(tmp_path)}


def _check(env: dict, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(env["PATH"]) / "bash"), str(SCRIPT), *options, "--check"], capture_output=True, text=True, env=env
    )


def _apt_host(tmp_path: Path, devices: int) -> dict:
    """A host for --apt: sudo runs its command, apt-get appends its arguments to apt.log, the key download and the
    repository files go nowhere, modprobe loads nothing; `devices` /dev/neuron* nodes."""
    env = _host(tmp_path, ("3.12",))
    bin_dir = Path(env["PATH"])
    stubs = {
        "sudo": '#!/bin/sh\nexec "$@"\n',
        "apt-get": f'#!/bin/sh\necho "$@" >> {tmp_path / "apt.log"}\n',
        "curl": "#!/bin/sh\n",
        "gpg": "#!/bin/sh\ncat >/dev/null\n",
        "tee": "#!/bin/sh\ncat >/dev/null\n",
        "modprobe": "#!/bin/sh\nexit 1\n",
    }
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    dev = tmp_path / "dev"
    dev.mkdir()
    for index in range(devices):
        (dev / f"neuron{index}").touch()
    return {**env, "DEV_DIR": str(dev)}


def _script_variable(name: str) -> str:
    return re.search(rf'^{name}="?([^"\n]*)"?$', SCRIPT.read_text(), re.MULTILINE).group(1)


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


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_pins_agree_with_the_neuron_extra_and_check_host():
    pyproject = (SCRIPT.parents[1] / "pyproject.toml").read_text()
    neuron_extra = re.findall(r'"([^"]+)"', re.search(r"^neuron = \[(.*?)\]", pyproject, re.S | re.M).group(1))
    assert sorted(_script_variable("PIP_PINS").split()) == sorted(neuron_extra)
    for pin in neuron_extra:
        name, version = pin.split("==")
        assert version.rstrip("*") == EXPECTED[name], pin
    assert _script_variable("NEURON_SDK") == "2.33.0"


def test_apt_installs_the_kernel_headers_and_the_sdk_packages_pinned_then_checks_the_driver(tmp_path):
    done = _check(_apt_host(tmp_path, devices=2), "--apt")
    assert done.returncode == 0, done.stderr
    install = (tmp_path / "apt.log").read_text().splitlines()[-1].split()
    assert install[:3] == ["install", "-y", "--allow-downgrades"]
    assert "linux-headers-7.0.0-1001-aws" in install
    assert set(_script_variable("APT_PINS").split()) <= set(install)
    assert {"aws-neuronx-dkms=2.31.7.0*", "aws-neuronx-runtime-lib=2.35.30.0*"} <= set(install)
    assert "Neuron driver loaded: 2 device(s)" in done.stdout


def test_apt_stops_when_the_driver_is_not_loaded(tmp_path):
    done = _check(_apt_host(tmp_path, devices=0), "--apt")
    assert done.returncode == 1
    assert "error: the Neuron driver is not loaded: no " in done.stderr
    assert "linux-headers-7.0.0-1001-aws" in done.stderr and "dkms status" in done.stderr
