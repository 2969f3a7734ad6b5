"""vLLM's view of a Neuron host: ONP_BACKEND=neuron without NeuronCores is refused with a clear message, the device
count is the NeuronCores torch-neuronx sees, and the worker's core pinning leaves a user's choice alone."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from optimum_neuron_plugin.backends.neuron import neuron_core_count, pin_cores
from optimum_neuron_plugin.placement import Rank

pytest.importorskip("vllm")
from optimum_neuron_plugin.vllm.platform import NeuronPlatform  # noqa: E402

NO_CORES = pytest.mark.skipif(neuron_core_count() > 0, reason="this host has NeuronCores and torch-neuronx")


@NO_CORES
def test_onp_backend_neuron_without_cores_is_refused(monkeypatch):
    monkeypatch.setenv("ONP_BACKEND", "neuron")
    with pytest.raises(RuntimeError) as raised:
        NeuronPlatform.check_and_update_config(SimpleNamespace(model_config=None))
    message = str(raised.value)
    assert "ONP_BACKEND=neuron" in message and "trn2/trn3" in message and "ONP_BACKEND=cpu" in message
    assert NeuronPlatform.device_count() == 0


def test_the_cpu_backend_is_one_device_with_the_host_memory(monkeypatch):
    monkeypatch.setenv("ONP_BACKEND", "cpu")
    NeuronPlatform.check_and_update_config(SimpleNamespace(model_config=None))
    assert NeuronPlatform.device_count() == 1
    assert NeuronPlatform.get_device_total_memory() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_pin_cores_gives_the_worker_its_core_among_those_chosen(monkeypatch):
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    pin_cores(Rank(dp_rank=1, dp_size=2))
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "1"
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "4-7")
    pin_cores(Rank(dp_rank=1, dp_size=2, tp_rank=0, tp_size=2))
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "6"
