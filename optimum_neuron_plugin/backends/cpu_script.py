"""The CPU programs replayed by TorchScript's C++ interpreter instead of called op by op from Python.

A choice of the CPU backend about how to run a program, like the packed linears about which kernel: the graph
is the exported one. An exported program is ~2000 aten calls per decode step (SmolLM2), most on tensors of a
few KB, and dispatching each from Python costs about as much as the kernel. The first call of a program (the
warm-up) runs under torch.jit.trace, which executes it and records every op; later calls replay the record in
C++: the same kernels on the same tensors, so the results are those of the program, bit for bit.

TorchScript reports every failure as a RuntimeError with its own traceback. A replay that fails is run again
by the program, which raises the real error (e.g. IndexError for a token id beyond the vocabulary). Running a
call twice is safe: it writes the same K/V to the same cache positions before reading them. A replay that fails
where the program runs is TorchScript's fault: that call runs from Python, and after REPLAY_FAILURES_IN_A_ROW such
calls the program runs from Python for good.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch

from ..torch_compat import trace_module, unoptimized_replay

logger = logging.getLogger(__name__)

REPLAY_FAILURES_IN_A_ROW = 3  # replays failing where the program runs, before it stops replaying


class _Recorder(torch.nn.Module):
    """The program under trace, keeping the output of the call that is traced (the trace returns none)."""

    def __init__(self, program: torch.nn.Module, outputs: list) -> None:
        super().__init__()
        self.program, self.outputs = program, outputs

    def forward(self, *args):
        output = self.program(*args)
        self.outputs.append(output)
        return output


class Replay:
    """A program and the trace of its first call: calls replay the trace."""

    def __init__(self, program: torch.nn.Module, trace: Callable) -> None:
        self.program, self.trace = program, trace
        self.failures = 0  # replays in a row that failed where the program ran

    def __call__(self, *args):
        if self.trace is None:
            return self.program(*args)
        with contextlib.suppress(Exception), unoptimized_replay():
            output = self.trace(*args)
            self.failures = 0
            return output
        # TorchScript's RuntimeError hides the error: the program raises it (outside an except block, so the log
        # shows the program's error alone).
        output = self.program(*args)
        self._replay_failed()
        return output

    def _replay_failed(self) -> None:
        """The program ran where its replay failed: TorchScript is at fault."""
        self.failures += 1
        if self.failures < REPLAY_FAILURES_IN_A_ROW:
            logger.debug("a CPU program's replay failed where the program ran (%d in a row)", self.failures)
            return
        logger.warning(
            "a CPU program failed %d times in a row in TorchScript's interpreter but not from Python: it runs from "
            "Python now",
            self.failures,
        )
        self.trace = None


def traced_call(program: torch.nn.Module, args: tuple) -> tuple[object, Replay | None]:
    """program(*args), run under torch.jit.trace: its output and the Replay of later calls. A program TorchScript
    cannot record keeps running from Python (None); a call that fails raises the program's own error."""
    outputs: list = []
    try:
        trace = trace_module(_Recorder(program, outputs), args)
    except Exception as error:  # noqa: BLE001 - the program's own failure is raised again just below
        failure = error
    else:
        return outputs[0], Replay(program, trace)
    output = program(*args)
    logger.warning("a CPU program runs from Python: torch.jit.trace failed (%s)", failure)
    return output, None
