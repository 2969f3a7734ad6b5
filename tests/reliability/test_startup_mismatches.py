"""A `vllm serve` option the artifact cannot honour refuses to start, saying what to change.

--tensor-parallel-size is refused while the command line is parsed (the platform's argument hook): a usage error. The
run starts in the background with the first test of this directory (conftest `refusals`). The options the plugin's
configuration check refuses are checked in-process, together (tests/vllm/test_refused_options.py); a refusal of that
check stopping `vllm serve` is test_faults.py's missing-field run.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # a live `vllm serve`


def test_a_mismatched_tensor_parallel_size_refuses_to_start(refusals):
    result = refusals.result("tensor-parallel-size")
    assert not result.timed_out, f"vllm serve still running after {result.seconds:.0f} s:\n{result.output[-3000:]}"
    assert result.returncode != 0, result.output[-3000:]
    for fragment in (
        "tensor_parallel_size=2 does not match the artifact's tp_degree=1",
        "omit --tensor-parallel-size (or pass 1)",
    ):
        assert fragment in result.output, result.output[-3000:]
    assert "Starting vLLM server" not in result.output
