"""The server's log during the warm-up: its start and how far it got, so minutes of tracing never look like a hang."""

from __future__ import annotations

import logging

import pytest

from optimum_neuron_plugin.runtime import NeuronModelForCausalLM
from optimum_neuron_plugin.vllm.log import WarmUpLog


@pytest.fixture(scope="module")
def model(chunked_dir) -> NeuronModelForCausalLM:
    return NeuronModelForCausalLM.from_pretrained(chunked_dir)


@pytest.fixture
def records():
    logger, captured = logging.getLogger("vllm.plugins.test_warm_up"), []
    handler = logging.Handler()
    handler.emit = captured.append
    logger.addHandler(handler), logger.setLevel(logging.INFO)
    yield logger, captured
    logger.removeHandler(handler)


def test_the_warm_up_logs_its_start_and_each_graph_done_when_due(model, records):
    logger, captured = records
    total = len(model.specs)
    model.warm_up(WarmUpLog(logger, "the model", every=0.0))
    lines = [record.getMessage() for record in captured]
    assert lines[0] == f"warm-up of the model: the first call of each of its {total} compiled graphs"
    assert [line.split(" graphs in ")[0] for line in lines[1:]] == [
        f"warm-up of the model: {done} of {total}" for done in range(1, total)
    ]  # the last graph is the worker's line ("warm-up of the compiled graphs took ... s")
    assert total > 4 and set(model.graphs.uncalled) == set()


def test_a_quick_warm_up_logs_only_its_start(model, records):
    logger, captured = records
    model.warm_up(WarmUpLog(logger, "the draft model", every=3600.0))
    assert [record.getMessage() for record in captured] == [
        f"warm-up of the draft model: the first call of each of its {len(model.specs)} compiled graphs"
    ]
