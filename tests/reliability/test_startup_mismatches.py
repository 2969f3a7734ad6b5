"""`vllm serve` options the artifact cannot honour refuse to start, saying what to change.

The runs start in the background with the first test of this directory (conftest `refusals`): one for the options
the plugin's configuration check refuses (it reports them all at once), one for --tensor-parallel-size (refused
while the command line is parsed).
"""

from __future__ import annotations

import pytest
from support.served import BATCH_SIZE, SEQUENCE_LENGTH

pytestmark = pytest.mark.slow  # a live `vllm serve`

# option: the refusal run that passes it (conftest `refusals`)
RUNS = {
    "max-num-seqs": "engine-options", "max-model-len": "engine-options", "tensor-parallel-size": "tensor-parallel-size",
}  # fmt: skip
MISMATCHES = {  # option: what the run's output must say
    "max-num-seqs": (
        f"max_num_seqs={BATCH_SIZE + 1} exceeds the artifact's compiled batch_size={BATCH_SIZE}",
        f"pass --max-num-seqs {BATCH_SIZE} or less (or omit it), or export the model again with a larger --batch-size",
    ),
    "max-model-len": (
        f"max_model_len={2 * SEQUENCE_LENGTH} exceeds the artifact's compiled sequence_length={SEQUENCE_LENGTH}",
        f"pass --max-model-len {SEQUENCE_LENGTH} or less (or omit it)",
    ),
    "tensor-parallel-size": (
        "tensor_parallel_size=2 does not match the artifact's tp_degree=1",
        "omit --tensor-parallel-size (or pass 1)",
    ),
}


@pytest.mark.parametrize("name", MISMATCHES)
def test_mismatched_option_refuses_to_start(refusals, name):
    result = refusals.result(RUNS[name])
    assert not result.timed_out, f"vllm serve still running after {result.seconds:.0f} s:\n{result.output[-3000:]}"
    assert result.returncode != 0, result.output[-3000:]
    for fragment in MISMATCHES[name]:
        assert fragment in result.output, result.output[-3000:]
    assert "Starting vLLM server" not in result.output
