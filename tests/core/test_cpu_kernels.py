"""The CPU backend's choices of how to run a program: every fp32 linear of every loaded program reads one shared
packed weight (the linears of one input stacked into one), and each program is replayed from the TorchScript trace
of its first call, bit for bit, its ops' C++ kernels called without entering Python."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from support.references import hf_greedy, runtime_greedy

import optimum_neuron_plugin
from optimum_neuron_plugin import NeuronModelForCausalLM
from optimum_neuron_plugin.backends import cpu_linear
from optimum_neuron_plugin.backends.cpu_script import REPLAY_FAILURES_IN_A_ROW
from optimum_neuron_plugin.graphs import COPY_PREFIX, TOKEN_GENERATION, example_inputs

from . import helpers


def _packed_linears(program: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The program's linears on packed weights: oneDNN's (`_packed_linear`) or the few-row kernel's."""
    rows_linear = torch.ops.onp_cpu.rows_linear.default
    return [
        n
        for n in program.graph.nodes
        if n.op == "call_function" and (n.target is rows_linear or n.target.__name__ == "_packed_linear")
    ]


def model_programs(model) -> list:
    """The programs that run the model (copy_prefix only moves cache rows: it has no linear)."""
    return [program for spec, program in model.graphs.programs.items() if spec.name != COPY_PREFIX]


def test_every_linear_reads_a_weight_packed_once_for_all_programs(llama_logits):
    """oneDNN's packing for the programs of many tokens, the few-row kernel's for those of at most 4 (decode steps)."""
    model = llama_logits.model
    programs = model_programs(model)
    assert len(programs) > 1
    packed_by_name: dict[str, set[int]] = {}
    few_row_programs = 0
    for spec, program in zip(model.graphs.programs, model.graphs.programs.values(), strict=True):
        if spec.name == COPY_PREFIX:
            continue
        linears = program.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
        assert linears == [], f"{len(linears)} linears left on MKL's unpacked path"
        packed = _packed_linears(program)
        # 2 layers x (q+k+v, o, gate+up, down) + the lm_head: linears of one input run as one product
        assert len(packed) == 2 * 4 + 1
        stacked = sorted(node.args[1].target for node in packed if "__" in node.args[1].target)
        assert sorted(name.count("__") for name in stacked) == [1, 1, 2, 2]
        few_rows = spec.computed_tokens <= cpu_linear.ROWS_KERNEL_MAX
        few_row_programs += few_rows
        for node in packed:
            weight = getattr(program, node.args[1].target)
            assert (node.target is torch.ops.onp_cpu.rows_linear.default) == few_rows
            assert weight.is_mkldnn != few_rows
            packed_by_name.setdefault(node.args[1].target, set()).add(id(weight))
    assert 0 < few_row_programs < len(programs)
    assert all(len(ids) == 1 for ids in packed_by_name.values()), "a weight was packed more than once"


def test_a_torch_without_onednn_keeps_the_exported_linears_and_hf_tokens(llama_logits, monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    cpu_linear.packable.cache_clear()
    try:
        model = NeuronModelForCausalLM.from_pretrained(llama_logits.path)
    finally:
        cpu_linear.packable.cache_clear()
    for program in model_programs(model):
        assert _packed_linears(program) == []
        assert program.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    prompt = helpers.prompt(13, seed=5)
    assert runtime_greedy(model, prompt, 6) == hf_greedy(llama_logits.hf, prompt, 6)


def _run(model: NeuronModelForCausalLM) -> list[torch.Tensor]:
    """Prompts in two slots over several buckets, then decode steps of both: every logit the graphs returned."""
    first, second = helpers.prompt(21, seed=7), helpers.prompt(9, seed=8)
    logits = [model.prefill(0, first), model.prefill(1, second)]
    tokens, positions = [int(logits[0].argmax()), int(logits[1].argmax())], [len(first), len(second)]
    for _ in range(14):
        result = model.decode([0, 1], tokens, positions)
        logits.append(result.logits)
        tokens, positions = [int(row.argmax()) for row in result.logits], [p + 1 for p in positions]
    return logits


def test_replayed_programs_return_the_programs_logits_and_cache_bit_for_bit(llama_logits):
    replayed = NeuronModelForCausalLM.from_pretrained(llama_logits.path)
    from_python = NeuronModelForCausalLM.from_pretrained(llama_logits.path)
    from_python.graphs.replayable = set()
    got, want = _run(replayed), _run(from_python)
    used = {spec for spec in replayed.specs if spec not in replayed.graphs.uncalled}
    assert len(used) >= 4 and set(replayed.graphs.traces) == used
    assert from_python.graphs.traces == {}
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(replayed.caches, from_python.caches, strict=True))


def test_a_replay_runs_the_ops_kernels_without_calling_python(llama_logits):
    """The onp ops' CPU kernels are registered from C++ (backends/cpu_kernels.py): a replayed program runs each one
    without entering Python, which a kernel registered from Python would on every call (taking the GIL)."""
    model = NeuronModelForCausalLM.from_pretrained(llama_logits.path)
    model.warm_up()
    spec = model.select(TOKEN_GENERATION, 1, (), [5])
    graphs = model.graphs
    replay, args = graphs.traces[spec].trace, (graphs.params, graphs.caches, *example_inputs(spec))
    ops = {"rms_norm", "gated_activation", "rope", "decode_attention"}
    assert ops <= {str(node.target).split(".")[1] for node in graphs.programs[spec].graph.nodes
                   if str(node.target).startswith("onp.")}  # fmt: skip
    ours = (str(Path(torch.__file__).parent / "_library"), str(Path(optimum_neuron_plugin.__file__).parent))
    called: list[str] = []

    def record(frame, event, arg) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(ours):
            called.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    with torch.inference_mode():
        sys.setprofile(record)
        try:
            replay(*args)
        finally:
            sys.setprofile(None)
    assert called == []


def test_a_failing_replay_raises_the_programs_own_error(llama_logits):
    model = NeuronModelForCausalLM.from_pretrained(llama_logits.path)
    model.warm_up()
    spec = model.select(TOKEN_GENERATION, 1, (), [5])
    assert spec in model.graphs.traces
    rows = model.neuron_config.batch_size
    beyond_vocab = torch.full((rows, 1), helpers.VOCAB + 3, dtype=torch.int32)
    positions, seq_ids = torch.full((rows, 1), 5, dtype=torch.int32), torch.arange(rows, dtype=torch.int32)
    with pytest.raises(IndexError, match="out of bounds"):
        model.graphs(spec, beyond_vocab, positions, seq_ids)


def test_replays_failing_where_the_program_runs_hand_over_to_the_program_when_in_a_row(llama_logits):
    model = NeuronModelForCausalLM.from_pretrained(llama_logits.path)
    from_python = NeuronModelForCausalLM.from_pretrained(llama_logits.path)
    from_python.graphs.replayable = set()
    model.warm_up(), from_python.warm_up()

    def interpreter_fault(*args):
        raise RuntimeError("The following operation failed in the TorchScript interpreter.")

    replays = {(spec.name, spec.bucket): replay for spec, replay in model.graphs.traces.items()}
    for replay in replays.values():
        replay.trace = interpreter_fault
    with helpers.CallLog(model) as log:
        got = _run(model)
    want = _run(from_python)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(model.caches, from_python.caches, strict=True))
    calls = Counter(log.graphs_and_buckets)
    assert len(calls) >= 4
    # Each failing call ran from Python; a program that failed REPLAY_FAILURES_IN_A_ROW times runs from Python now.
    handed_over = {key for key, count in calls.items() if count >= REPLAY_FAILURES_IN_A_ROW}
    assert handed_over and handed_over != set(calls)  # decode steps, and prompt chunks called fewer times
    assert {key for key, replay in replays.items() if replay.trace is None} == handed_over
    assert all(replays[key].failures == count for key, count in calls.items() if key not in handed_over)
