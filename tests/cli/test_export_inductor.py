"""`optimum-cli export neuron --cpu-compiler inductor`: AOTInductor packages (a C++ compile per graph, minutes in
all), in a file of their own so that the test runner can run it beside tests/cli/test_export.py."""

from __future__ import annotations

import pytest
from support.exports import assert_same_greedy, load_hf, neuron_config, prompt_ids

from .helpers import run_export


@pytest.mark.slow  # AOTInductor: a C++ compile per graph
def test_inductor_export_is_cpp_programs_that_match_hf(tiny_models, tmp_path):
    """--cpu-compiler inductor (AOTInductor, minutes per graph): the fewest graphs a chunked export has (one row,
    one context bucket), each a C++ package that generates HF's greedy tokens."""
    output = tmp_path / "inductor"
    result = run_export(
        "--model", tiny_models["llama"], "--batch-size", "1", "--sequence-length", "64", "--backend", "cpu",
        "--prefill-chunk-size", "16", "--context-buckets", "64", "--prefill-buckets", "0,64",
        "--cpu-compiler", "inductor", output,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    graphs = sorted(p.name for p in (output / "graphs").iterdir())
    assert graphs == [
        "chunked_prefill_0.aoti.pt2",
        "chunked_prefill_64.aoti.pt2",
        "token_generation_64.aoti.pt2",
    ]
    assert neuron_config(output)["cpu_compiler"] == "inductor"
    assert_same_greedy(output, load_hf(tiny_models["llama"]), prompt_ids(tiny_models["llama"]), eos=set())
