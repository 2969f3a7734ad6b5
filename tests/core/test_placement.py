"""Where a rank runs: its NeuronCore and its share of the CPU backend's threads, from (dp rank, tp rank)."""

from __future__ import annotations

import pytest

from optimum_neuron_plugin.placement import Rank, cpu_threads, neuron_core, parse_cores


def test_ranks_number_engines_then_their_tensor_parallel_ranks():
    ranks = [Rank(dp, 3, tp, 2) for dp in range(3) for tp in range(2)]
    assert [r.index for r in ranks] == list(range(6))
    assert {r.count for r in ranks} == {6}
    with pytest.raises(ValueError, match="is not a rank of 2 engine"):
        Rank(dp_rank=2, dp_size=2)


def test_each_rank_gets_its_own_core_among_the_visible_ones():
    assert [neuron_core(Rank(dp, 2)) for dp in range(2)] == [0, 1]  # unset: cores 0..count-1
    assert [neuron_core(Rank(dp, 2), "4-5") for dp in range(2)] == [4, 5]
    assert [neuron_core(Rank(dp, 2, tp, 2), "4-7") for dp in range(2) for tp in range(2)] == [4, 5, 6, 7]
    assert neuron_core(Rank(), "3") == 3  # one server on the core its user chose
    assert parse_cores(" 0-2, 3") == [0, 1, 2, 3]  # one range, however written (tests/neuron: gaps are refused)


def test_too_few_visible_cores_or_a_bad_list_is_refused_in_one_line():
    with pytest.raises(ValueError) as error:
        neuron_core(Rank(1, 2, 1, 2), "0-2")
    assert str(error.value) == (
        "4 rank(s) (data parallel 2 x tensor parallel 2) need 4 NeuronCores but NEURON_RT_VISIBLE_CORES='0-2' "
        "lists 3: list more cores, or lower --data-parallel-size"
    )
    with pytest.raises(ValueError, match="is not a core list"):
        neuron_core(Rank(), "a-b")


def test_threads_are_split_evenly_and_every_rank_keeps_one():
    assert [cpu_threads(Rank(dp, 2), 8) for dp in range(2)] == [4, 4]
    assert [cpu_threads(Rank(dp, 2), 3) for dp in range(2)] == [2, 1]
    assert [cpu_threads(Rank(dp, 2, tp, 2), 8) for dp in range(2) for tp in range(2)] == [2, 2, 2, 2]
    assert [cpu_threads(Rank(dp, 4), 2) for dp in range(4)] == [1, 1, 1, 1]  # more ranks than threads
    assert cpu_threads(Rank(), 2) == 2
