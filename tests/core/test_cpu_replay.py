"""A CPU program's replay (backends/cpu_script.py) that fails where the program runs: that call runs from Python, and
only REPLAY_FAILURES_IN_A_ROW such calls in a row make the program run from Python for good, logged once."""

from __future__ import annotations

import logging

import torch

from optimum_neuron_plugin.backends.cpu_script import REPLAY_FAILURES_IN_A_ROW, traced_call


class Padded(torch.nn.Module):
    """x + a row of ones as long as x, counting the calls run from Python. The trace keeps the length of the traced
    call's x (an int taken from a tensor is a constant of the trace): its replay fails on any other length."""

    def __init__(self) -> None:
        super().__init__()
        self.python_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.python_calls += 1
        return x + torch.ones(int(x.shape[0]))


def test_a_replay_failing_where_the_program_runs_runs_that_call_from_python_until_it_fails_in_a_row(caplog):
    program = Padded()
    output, replay = traced_call(program, (torch.zeros(4),))
    assert replay is not None and program.python_calls == 1 and output.tolist() == [1.0] * 4
    caplog.set_level(logging.WARNING, logger="optimum_neuron_plugin.backends.cpu_script")

    def call(length: int) -> int:
        """Python calls the call took (0: replayed), after checking its output."""
        before = program.python_calls
        assert replay(torch.full((length,), 2.0)).tolist() == [3.0] * length
        return program.python_calls - before

    assert call(4) == 0  # replayed
    # Fewer failures in a row, twice: each failing call runs from Python, the program keeps replaying.
    for _ in range(2):
        assert [call(5) for _ in range(REPLAY_FAILURES_IN_A_ROW - 1)] == [1] * (REPLAY_FAILURES_IN_A_ROW - 1)
        assert call(4) == 0
    assert not caplog.records
    # In a row: the last one hands the program over to Python, logged once.
    assert [call(6) for _ in range(REPLAY_FAILURES_IN_A_ROW)] == [1] * REPLAY_FAILURES_IN_A_ROW
    assert call(4) == 1 and call(5) == 1  # from Python for good, the traced length too
    (warning,) = caplog.records
    assert f"failed {REPLAY_FAILURES_IN_A_ROW} times in a row" in warning.getMessage()
