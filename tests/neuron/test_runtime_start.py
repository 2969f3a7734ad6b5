"""Who starts the Neuron runtime, and on which cores, on a trn2 host as the plugin sees it (stand-in torch_neuronx,
stand_in/torch_neuronx: its device-memory query starts the runtime, which then reserves every core it sees).

- vLLM's API-server process asks the platform for the device count and memory and checks the configuration: none
  of it may start the runtime, or the engine's workers find their cores in use.
- A tensor-parallel-1 export takes one core, chosen before the runtime starts.
- NEURON_RT_VISIBLE_CORES must be one contiguous, increasing range; anything else is refused with what to write.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from optimum_neuron_plugin.backends import neuron
from optimum_neuron_plugin.config import NeuronConfig
from optimum_neuron_plugin.placement import Rank, neuron_core, parse_cores
from tests.neuron.stand_in.torch_neuronx import read_log

pytest.importorskip("vllm")
from optimum_neuron_plugin.vllm.platform import NeuronPlatform  # noqa: E402

CONFIG = dict(backend="neuron", batch_size=2, sequence_length=32, prefill_chunk_size=8, torch_dtype="bfloat16")
HOST_MEMORY = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_the_front_end_never_starts_the_neuron_runtime(stand_in_sdk, monkeypatch):
    monkeypatch.setenv("ONP_BACKEND", "neuron")
    # What vLLM's API server asks the platform (EngineArgs.create_engine_config -> get_batch_defaults, the parallel
    # config's device count check) and the plugin's own configuration check.
    NeuronPlatform.check_and_update_config(SimpleNamespace(model_config=None))
    count, memory = NeuronPlatform.device_count(), NeuronPlatform.get_device_total_memory()
    assert NeuronPlatform.get_device_name() == "neuron"
    assert read_log(stand_in_sdk) == [], "the API-server process started the Neuron runtime"
    assert (count, memory) == (8, HOST_MEMORY)
    # The stand-in does record a start: the device-memory query is one (as torch_neuronx.get_device_properties is).
    import torch_neuronx

    torch_neuronx.get_device_properties(0)
    assert read_log(stand_in_sdk) == [(os.getpid(), "all")]


def test_a_tensor_parallel_1_export_takes_one_core_before_the_runtime_starts(
    stand_in_sdk, fake_neuron_compiler, monkeypatch
):
    backend = neuron.NeuronBackend(NeuronConfig(**CONFIG))  # device "neuron": the checks of a trn2 host
    backend.check_can_compile()
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "0"
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "4-7")  # the user's share of the instance: its first core
    backend.check_can_compile()
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "4"
    assert read_log(stand_in_sdk) == []


@pytest.mark.parametrize(
    ("visible", "write"), [("0-3,8", "0-3"), ("4,6", "4"), ("3-1", "3"), ("2,1", "2"), ("0-1,1-2", "0-1")]
)
def test_visible_cores_that_are_not_one_increasing_range_are_refused_with_what_to_write(visible, write):
    with pytest.raises(ValueError) as raised:
        neuron_core(Rank(), visible)
    message = str(raised.value)
    assert f"NEURON_RT_VISIBLE_CORES={visible!r} is not one contiguous, increasing range" in message
    assert f"write {write} " in message


@pytest.mark.parametrize(("visible", "cores"), [("5", [5]), ("4-7", [4, 5, 6, 7]), ("0,1,2", [0, 1, 2])])
def test_one_core_or_one_range_is_accepted(visible, cores):
    assert parse_cores(visible) == cores
