"""A stand-in for TorchNeuron's `torch_neuronx` module on a host without the Neuron SDK: the calls the plugin makes,
with the runtime behaviour it relies on, after torch-neuronx 2.13 (torch_neuronx/__init__.py, csrc/core/NeuronDevice.cpp):
- device_count() asks the runtime how many cores are visible (nrt_get_visible_vnc_count) without starting it;
- get_device_properties() starts the runtime first (_lazy_init -> nrt_init), which reserves every core
  NEURON_RT_VISIBLE_CORES lets it see (all of them when unset: Neuron runtime configuration guide).
With RUNTIME_LOG_ENV set to a file, every runtime start appends "<pid> <NEURON_RT_VISIBLE_CORES or 'all'>" to it.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

RUNTIME_LOG_ENV = "ONP_TEST_NRT_LOG"
CORES_ENV = "ONP_TEST_NEURON_CORES"  # cores of the stand-in instance (default 8)
MEMORY = 24 * 2**30  # one logical trn2 core's share of HBM

__version__ = "2.13.3.0"
_initialized = False


def _instance_cores() -> int:
    return int(os.environ.get(CORES_ENV, "8"))


def _lazy_init() -> None:
    global _initialized
    if _initialized:
        return
    _initialized = True
    if os.environ.get(RUNTIME_LOG_ENV):
        with open(os.environ[RUNTIME_LOG_ENV], "a") as log:
            log.write(f"{os.getpid()} {os.environ.get('NEURON_RT_VISIBLE_CORES') or 'all'}\n")


def is_neuron_runtime_initialized() -> bool:
    return _initialized


def device_count() -> int:
    visible = os.environ.get("NEURON_RT_VISIBLE_CORES")
    if not visible:
        return _instance_cores()
    first, _, last = visible.partition("-")
    return int(last or first) - int(first) + 1


def get_device_properties(device) -> SimpleNamespace:
    _lazy_init()
    return SimpleNamespace(name="neuron", total_memory=MEMORY)


def read_log(path) -> list[tuple[int, str]]:
    """(pid, cores) per runtime start, in order."""
    if not os.path.isfile(path):
        return []
    with open(path) as log:
        return [(int(pid), cores) for pid, cores in (line.split() for line in log)]
