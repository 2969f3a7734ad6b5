"""The instance type a neuron export compiles for: --instance-type, else the host's (the stand-in SDK as a trn2 or a
trn3), which sets the FP8 weights' range, trn2's FP8 compiler option and the memory plan; `--check-host` on a host
whose TorchNeuron query fails. (FP8 without either on a host that is not a Neuron instance: tests/cli/test_plan.py.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from support.cli import export_in_process

from exporter.host_check import main as check_host
from optimum_neuron_plugin.config import NeuronConfig
from optimum_neuron_plugin.devices import resolve_target
from optimum_neuron_plugin.runtime.artifact_io import FP8_ON_TRN2_OPTION, to_params
from tests.neuron.conftest import build_tiny
from tests.neuron.stand_in.torch_neuronx.utils import TARGET_ENV, UNREADABLE

CONFIG_JSON = Path(__file__).parents[1] / "fixtures" / "llama-3.1-8b" / "config.json"
SHAPE = ("--batch-size", 8, "--sequence-length", 8192, "--prefill-chunk-size", 1024, "--backend", "neuron")
CONFIG = dict(backend="neuron", batch_size=2, sequence_length=32, prefill_chunk_size=8, torch_dtype="bfloat16")


@pytest.fixture
def config_only(tmp_path) -> Path:
    """Llama-3.1-8B's config.json alone: a dry run reads nothing else."""
    directory = tmp_path / "llama-3.1-8b"
    directory.mkdir()
    shutil.copyfile(CONFIG_JSON, directory / "config.json")
    return directory


@pytest.mark.parametrize(("host", "largest"), [("trn2", 240), ("trn3", 448)])
def test_fp8_weights_take_the_range_of_the_host_without_instance_type(stand_in_sdk, monkeypatch, host, largest):
    monkeypatch.setenv(TARGET_ENV, host)
    config = resolve_target(NeuronConfig(**CONFIG, quantization="fp8"))
    assert config.target == host
    tiny = build_tiny("llama")
    params = to_params(tiny.state_dict, tiny.args, torch.bfloat16, config)
    assert params["model.layers.0.mlp.down_proj.weight"].float().abs().max() == largest


@pytest.mark.parametrize("host", ["trn2", "trn3"])
def test_instance_type_given_wins_over_the_host(stand_in_sdk, monkeypatch, host):
    monkeypatch.setenv(TARGET_ENV, host)
    other = {"trn2": "trn3", "trn3": "trn2"}[host]
    assert resolve_target(NeuronConfig(**CONFIG, target=other, quantization="fp8")).target == other


def test_a_dry_run_sizes_for_the_host_without_instance_type(stand_in_sdk, monkeypatch, config_only, tmp_path):
    """Llama-3.1-8B at B 8, S 8192 needs 25.2 GiB per rank: one trn3 core holds it, one trn2 core does not."""
    monkeypatch.setenv(TARGET_ENV, "trn3")
    done = export_in_process("--model", config_only, *SHAPE, "--dry-run", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "backend neuron, target trn3," in done.stdout
    assert any("one trn3 logical NeuronCore at LNC=2: 36.00 GiB" in line for line in done.stdout.splitlines())
    monkeypatch.setenv(TARGET_ENV, "trn2")
    done = export_in_process("--model", config_only, *SHAPE, "--dry-run", tmp_path / "out")
    assert done.returncode == 1 and len(done.error_lines) == 1
    assert "one trn2 logical NeuronCore at LNC=2 holds 24.00 GiB" in done.error_lines[0]


def test_fp8_on_a_trn2_host_needs_the_compiler_option_as_one_unquoted_token(
    stand_in_sdk, monkeypatch, config_only, tmp_path
):
    """TorchNeuron splits NEURON_CC_FLAGS on whitespace and runs neuronx-cc without a shell: quotes would reach the
    compiler. The suggested setting, pasted into a shell, gives the option as one token."""
    monkeypatch.setenv(TARGET_ENV, "trn2")
    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    argv = ("--model", config_only, *SHAPE, "--tensor-parallel-size", 2, "--quantize", "fp8", "--dry-run", "out")
    done = export_in_process(*argv)
    assert done.returncode == 1 and len(done.error_lines) == 1 and "Traceback" not in done.stderr
    assert f"set NEURON_CC_FLAGS={FP8_ON_TRN2_OPTION} for the export and for vllm serve" in done.error_lines[0]

    monkeypatch.setenv(
        "NEURON_CC_FLAGS", "-O1 --internal-hlo2tensorizer-options='--experimental-unsafe-fp8e4m3fn-as-fp8e4m3'"
    )
    done = export_in_process(*argv)
    assert done.returncode == 1 and "quotes and spaces reach it as they are" in done.error_lines[0]
    assignment = re.search(r"set (NEURON_CC_FLAGS=.*) for the export", done.error_lines[0]).group(1)
    pasted = subprocess.run(
        ["bash", "-c", f'{assignment}; printf %s "$NEURON_CC_FLAGS"'], capture_output=True, text=True, check=True
    ).stdout
    assert pasted.split() == ["-O1", FP8_ON_TRN2_OPTION]  # the tokens neuronx-cc receives
    monkeypatch.setenv("NEURON_CC_FLAGS", pasted)
    done = export_in_process(*argv)
    assert done.returncode == 0, done.stderr

    monkeypatch.setenv(TARGET_ENV, "trn3")  # trn3 reads float8_e4m3fn as it is: no option needed
    monkeypatch.delenv("NEURON_CC_FLAGS")
    done = export_in_process(*argv)
    assert done.returncode == 0, done.stderr
    assert "backend neuron, target trn3," in done.stdout


def test_fp8_is_refused_when_torch_neuronx_cannot_read_the_instance_type(stand_in_sdk, monkeypatch, config_only):
    monkeypatch.setenv(TARGET_ENV, UNREADABLE)
    done = export_in_process("--model", config_only, *SHAPE, "--kv-cache-dtype", "fp8", "--dry-run", "out")
    assert done.returncode == 1 and len(done.error_lines) == 1 and "Traceback" not in done.stderr
    line = done.error_lines[0]
    assert "torch-neuronx could not read this host's instance type (RuntimeError: nrt_get_instance_info failed)" in line
    assert line.endswith("pass --instance-type trn2|trn3 (NeuronConfig target=)")


def test_check_host_reports_a_failed_instance_query_in_one_line(stand_in_sdk, monkeypatch, capsys):
    monkeypatch.setenv(TARGET_ENV, "trn3")
    check_host()
    out = capsys.readouterr().out
    assert "NeuronCores visible: 8 (NEURON_RT_VISIBLE_CORES=all), target trn3, LNC=2" in out
    assert "HBM per logical NeuronCore: 36 GiB, the chip's fair share" in out
    monkeypatch.setenv(TARGET_ENV, UNREADABLE)
    assert check_host() == 1
    err = capsys.readouterr().err
    assert (
        "error: torch-neuronx could not read this host's instance type (RuntimeError: nrt_get_instance_info failed): "
        "check the Neuron driver and runtime with `neuron-ls` (docs/neuron.md, step 1)"
    ) in err.splitlines()
    assert "Traceback" not in err
