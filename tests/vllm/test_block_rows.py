"""The runner's rows and waves (runner/rows.py): a request's batch row, and the order of the slices of a step when one
reads KV blocks another writes in the same step (vLLM hashes blocks when it allocates them, so a request admitted
later in a step may hit blocks an earlier one is about to write)."""

from __future__ import annotations

import pytest

from optimum_neuron_plugin.vllm.runner.rows import Rows, SliceBlocks, waves
from optimum_neuron_plugin.vllm.runner.step_input import ScheduledSlice

BLOCK = 4


def test_a_row_is_free_or_taken_from_a_request_not_scheduled_this_step():
    rows = Rows(2)
    assert rows.take("a", keep={"a"}) == (0, None)
    assert rows.take("b", keep={"b"}) == (1, None)
    rows.release(0)
    assert rows.take("c", keep={"c"}) == (0, None)
    # A streaming session ("b") waits for input, not scheduled: its row goes to a scheduled request.
    assert rows.take("d", keep={"c", "d"}) == (1, "b")
    with pytest.raises(RuntimeError, match="batch_size=2"):
        rows.take("e", keep={"c", "d", "e"})


def sliced(req_id: str, start: int, count: int, blocks: list[int]) -> SliceBlocks:
    return SliceBlocks(ScheduledSlice(req_id, start, count), blocks)


def test_a_slice_reading_blocks_written_this_step_runs_in_a_later_wave():
    step = [
        sliced("writer", 0, 10, [1, 2, 3]),  # writes blocks 1-3
        sliced("reader", 8, 5, [1, 2, 4, 5]),  # hit on blocks 1-2 (8 tokens), writes 4-5
        sliced("reader2", 12, 3, [1, 2, 4, 6]),  # hit on the writer's and the reader's blocks
        sliced("alone", 4, 4, [7, 8]),  # its own context only
        sliced("decode", 9, 1, [9, 10, 11]),
    ]
    result = waves(step, BLOCK)
    assert result.levels == {"writer": 0, "reader": 1, "reader2": 2, "alone": 0, "decode": 0}
    assert result.producers == {"reader": {"writer"}, "reader2": {"writer", "reader"}}
    assert result.count == 3


def test_a_step_without_shared_blocks_is_one_wave():
    step = [sliced("a", 0, 16, [1, 2, 3, 4]), sliced("b", 5, 1, [5, 6])]
    assert waves(step, BLOCK).count == 1
