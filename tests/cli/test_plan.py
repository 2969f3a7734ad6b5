"""`optimum-cli export neuron --dry-run` and the sizing refusal, from a directory holding only Llama-3.1-8B's
config.json: no weights are read and no Neuron SDK is needed (this host has none). The real optimum-cli prints the
first plan; the other checks run the same command in this process (tests/support/cli.py: export_in_process)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from .helpers import export_in_process, run_export

CONFIG = Path(__file__).parents[1] / "fixtures" / "llama-3.1-8b" / "config.json"
SHAPE = ("--batch-size", 8, "--sequence-length", 8192, "--prefill-chunk-size", 1024, "--backend", "neuron")


@pytest.fixture
def config_only(tmp_path) -> Path:
    directory = tmp_path / "llama-3.1-8b"
    directory.mkdir()
    shutil.copyfile(CONFIG, directory / "config.json")
    return directory


def test_dry_run_prints_the_graphs_and_the_plan_and_compiles_nothing(config_only, tmp_path):
    out = tmp_path / "out"
    done = run_export("--model", config_only, *SHAPE, "--instance-type", "trn2", "--tensor-parallel-size", 2,
                      "--dry-run", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    count = lines.index("9 graphs")
    graphs = lines[count - 9 : count]
    assert [line.split()[0] for line in graphs[:4]] == [f"chunked_prefill_{b}" for b in (0, 2048, 4096, 8192)]
    assert sum(line.split()[1] == "token_generation" for line in graphs) == 3
    assert "memory per rank (tensor parallel 2):" in lines[count + 1]
    assert any("one trn2 logical NeuronCore at LNC=2: 24.00 GiB" in line and line.endswith(": fits") for line in lines)
    pool = lines.index(next(line for line in lines if line.startswith("KV pool: blocks of ")))
    assert re.search(r"a request of 4,096 tokens \(--average-length\) takes \d+$", lines[pool])
    assert lines[pool + 1].startswith("  compiled ") and "8 rows per graph call" in lines[pool + 1]
    assert lines[pool + 2].startswith("  core holds ") and "after the weights (--num-blocks " in lines[pool + 2]
    assert not out.exists()


def test_dry_run_for_trn3(config_only, tmp_path):
    done = export_in_process("--model", config_only, *SHAPE, "--instance-type", "trn3", "--dry-run", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert any("one trn3 logical NeuronCore at LNC=2: 36.00 GiB" in line for line in done.stdout.splitlines())


def test_an_export_that_cannot_fit_is_refused_before_reading_weights(config_only, tmp_path):
    """The directory has no weights: reaching the weights would fail with another error."""
    out = tmp_path / "out"
    done = export_in_process("--model", config_only, *SHAPE, "--instance-type", "trn2", out)
    assert done.returncode == 1
    assert len(done.error_lines) == 1 and "Traceback" not in done.stderr
    error = done.error_lines[0]
    assert re.search(r"does not fit: [\d.]+ GiB per rank, one trn2 logical NeuronCore at LNC=2 holds 24.00 GiB", error)
    assert re.search(r"KV cache [\d.]+ GiB = [\d,]+ blocks of [\d,]+ tokens", error)
    assert re.search(
        r"after the weights the core holds [\d,]+ blocks = [\d,]+ tokens = [\d,]+ requests of 4,096 tokens: ", error
    )
    assert re.search(r"use --num-blocks \d+, or --tensor-parallel-size 2 \(the smallest that fits\)$", error)
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["llama-3.1-8b"]


@pytest.mark.parametrize("fp8", [("--quantize", "fp8"), ("--kv-cache-dtype", "fp8")])
def test_fp8_on_the_neuron_backend_needs_the_instance_type_on_a_host_that_is_not_neuron(config_only, tmp_path, fp8):
    """This host has no Neuron device: nothing says whether the FP8 weights hold +-240 (trn2) or +-448 (trn3)."""
    done = export_in_process("--model", config_only, *SHAPE, *fp8, "--dry-run", tmp_path / "out")
    assert done.returncode == 1 and len(done.error_lines) == 1 and "Traceback" not in done.stderr
    assert "this host is not a Neuron instance" in done.error_lines[0]
    assert done.error_lines[0].endswith("pass --instance-type trn2|trn3 (NeuronConfig target=)")


def test_a_dry_run_without_instance_type_on_a_host_that_is_not_neuron_says_it_sizes_for_trn2(config_only, tmp_path):
    done = export_in_process("--model", config_only, *SHAPE, "--tensor-parallel-size", 2, "--dry-run", tmp_path / "o")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("one trn2 logical NeuronCore at LNC=2: 24.00 GiB" in line for line in lines)
    assert (
        "  sized for trn2: no --instance-type, and this host is not a Neuron instance; pass --instance-type trn3 "
        "to size for a trn3" in lines
    )


def test_a_dry_run_counts_requests_at_the_average_length_it_is_given(config_only, tmp_path):
    shape = (*SHAPE, "--instance-type", "trn3", "--dry-run")
    done = export_in_process("--model", config_only, *shape, "--average-length", 1000, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    pool = next(line for line in lines if line.startswith("KV pool: "))
    assert re.search(r"a request of 1,000 tokens \(--average-length\) takes \d+$", pool)
    assert sum(" requests of 1,000 tokens" in line for line in lines) == 2  # the compiled pool, what the core holds
    for length in (0, 8193):
        done = export_in_process("--model", config_only, *shape, "--average-length", length, tmp_path / "out")
        assert done.returncode == 1 and len(done.error_lines) == 1
        assert (
            done.error_lines[0]
            == f"error: --average-length {length} is not allowed: must be in [1, sequence_length=8192]"
        )


def test_the_pool_the_refusal_offers_fits_and_one_block_more_does_not(config_only, tmp_path):
    shape = (*SHAPE, "--instance-type", "trn2")
    refused = export_in_process("--model", config_only, *shape, tmp_path / "out")
    held = int(re.search(r"use --num-blocks (\d+), or", refused.error_lines[0]).group(1))
    fits = export_in_process("--model", config_only, *shape, "--num-blocks", held, "--dry-run", tmp_path / "out")
    assert fits.returncode == 0, fits.stderr
    assert f"  compiled     {held:,} blocks = " in fits.stdout and fits.stdout.count(f"(--num-blocks {held}") == 2
    over = export_in_process("--model", config_only, *shape, "--num-blocks", held + 1, "--dry-run", tmp_path / "out")
    assert over.returncode == 1 and f"use --num-blocks {held}, or" in over.error_lines[0]


def test_a_dry_run_with_lora_slots_says_what_they_add_to_every_graph(config_only, tmp_path):
    """Llama-3.1-8B, every projection: 32 layers x 7 projections, at any slot count and rank."""
    lines = []
    for loras, rank in ((1, 8), (16, 64)):
        lora = ("--max-loras", loras, "--max-lora-rank", rank)
        done = export_in_process("--model", config_only, *SHAPE, "--instance-type", "trn3", *lora, "--dry-run",
                                 tmp_path / "out")  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines.append(next(line for line in done.stdout.splitlines() if line.startswith("LoRA slots add ")))
    assert lines[0] == lines[1]
    assert lines[0].startswith(
        "LoRA slots add 1,792 operations to each graph (224 projections x 8; chunk_and_decode x 19)"
    )


def test_the_operations_the_plan_counts_are_those_of_the_exported_graphs(tiny_llama, tmp_path):
    """The graphs of a tiny Llama exported without slots and with two slot shapes: each graph gains exactly what
    the plan says (one row group: x 8 per projection; chunk_and_decode's two: x 19), the same at both shapes."""
    from optimum_neuron_plugin.backends.cpu_serde import load_program

    shape = ("--batch-size", 2, "--sequence-length", 64, "--prefill-chunk-size", 32, "--context-buckets", 64,
             "--speculative-tokens", 2)  # fmt: skip
    targets = ("--lora-target-modules", "q_proj,v_proj,down_proj")

    def operations(*options) -> dict[str, int]:
        out = tmp_path / "-".join(map(str, options or ("base",)))
        done = export_in_process("--model", tiny_llama, *shape, *options, out)
        assert done.returncode == 0, done.stderr
        graphs = sorted((out / "graphs").glob("*.pt2"))
        return {p.name: sum(n.op == "call_function" for n in load_program(p).graph.nodes) for p in graphs}

    base = operations()
    for loras, rank in ((1, 2), (3, 8)):
        with_slots = operations("--max-loras", loras, "--max-lora-rank", rank, *targets)
        projections = 3 * 2  # three targets, two layers
        added = {name: with_slots[name] - count for name, count in base.items()}
        assert added == {name: projections * (19 if "chunk_and_decode" in name else 8) for name in base}, added
