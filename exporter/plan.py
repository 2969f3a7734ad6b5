"""The export plan: the graphs an export compiles and the memory one rank needs, from the model's config alone.

`--dry-run` prints it and stops; every export prints it and, on the neuron backend, refuses at once (before any
weight is read) an export whose rank cannot fit one logical NeuronCore.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ExportPlan:
    graph_lines: list[str]
    memory: object  # optimum_neuron_plugin.sizing.MemoryPlan
    lora_lines: list[str]

    def lines(self) -> list[str]:
        return [*self.graph_lines, f"{len(self.graph_lines)} graphs", *self.lora_lines, *self.memory.lines()]


def graph_line(spec) -> str:
    """One graph of an export: kind, [rows x tokens], bucket, what it returns (its file name in the artifact)."""
    from optimum_neuron_plugin.graphs import COPY_PREFIX

    shape = f"[{spec.rows} x {spec.tokens}]" + (f" + chunk {spec.chunk}" if spec.chunk else "")
    output = "samples on device" if spec.samples else "returns logits"
    if spec.name == COPY_PREFIX:
        output = "copies a slot's rows"
    return f"{spec.key:<32} {spec.name:<18} {shape:<20} {spec.bucket_label:<20} {output}"


def lora_lines(args, neuron_config) -> list[str]:
    """What LoRA slots add to the graphs, hence to their compile time: operations per graph, not growing with the
    slot count or the rank (benchmark/graph_cases/lora_export.py measures the export time)."""
    from optimum_neuron_plugin.models import lora

    if not neuron_config.lora:
        return []
    projections = lora.projection_count(args, neuron_config.lora_target_modules)
    one, two = lora.operations_per_projection(1), lora.operations_per_projection(2)
    return [
        f"LoRA slots add {projections * one:,} operations to each graph ({projections} projections x {one}; "
        f"chunk_and_decode x {two}), whatever --max-loras and --max-lora-rank: they size the slot inputs only "
        "(compile time: docs/lora.md)"
    ]


# A neuron export without a target (no --instance-type, and this host is not a Neuron instance) is sized for trn2, the
# chip with less HBM per core: a plan that fits it fits trn3.
UNKNOWN_TARGET_CHIP = "trn2"


def chip_for(neuron_config):
    """The chip a neuron export is sized for: its target (--instance-type, else the host's: optimum_neuron_plugin.
    target), UNKNOWN_TARGET_CHIP when neither says; None for cpu."""
    from optimum_neuron_plugin.sizing import CHIPS

    if neuron_config.backend != "neuron":
        return None
    return CHIPS[neuron_config.target or UNKNOWN_TARGET_CHIP]


def make_plan(args, neuron_config, lnc: int | None = None, average_length: int | None = None) -> ExportPlan:
    from optimum_neuron_plugin.graphs import graph_specs
    from optimum_neuron_plugin.sizing import lnc_from_env, plan_memory

    chip = chip_for(neuron_config)
    lnc = lnc or (lnc_from_env(chip) if chip else None)
    specs = graph_specs(neuron_config, args.vocab_size)
    memory = plan_memory(args, neuron_config, chip, lnc, average_length)
    return ExportPlan([graph_line(spec) for spec in specs], memory, lora_lines(args, neuron_config))


def plan_export(
    model: Path, neuron_config, progress: Callable[[str], None], average_length: int | None = None
) -> ExportPlan:
    """Reads the model's config (no weights), checks the options against it, prints the plan (the KV pool counted in
    requests of `average_length` tokens) and refuses a neuron export that does not fit (SizingError naming the pool
    the core holds and the smallest tensor-parallel degree that fits)."""
    from optimum_neuron_plugin.runtime.artifact_io import check_model
    from optimum_neuron_plugin.sizing import check_fits
    from optimum_neuron_plugin.sources import read_config

    _, args = read_config(model)
    check_model(neuron_config, args)
    plan = make_plan(args, neuron_config, average_length=average_length)
    for line in plan.lines():
        progress(line)
    if neuron_config.backend == "neuron" and neuron_config.target is None:
        progress(
            f"  sized for {UNKNOWN_TARGET_CHIP}: no --instance-type, and this host is not a Neuron instance; pass "
            "--instance-type trn3 to size for a trn3"
        )
    check_fits(plan.memory, args, neuron_config)
    return plan
