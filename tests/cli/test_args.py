"""In-process checks of the argument handling (fast; the subprocess tests cover the real optimum-cli)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exporter.cli import build_parser, request_from_args, resolve_chunk_size, resolve_dtype
from optimum_neuron_plugin.devices import neuron_devices_present

from .helpers import OPTIMUM_CLI, REPO

BASE = ["--model", "m", "--batch-size", "2", "--sequence-length", "64", "out"]


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_dash_and_underscore_spellings_are_equivalent():
    dashed = parse(
        "--model", "m", "--batch-size", "2", "--sequence-length", "512", "--prefill-chunk-size", "128",
        "--tensor-parallel-size", "2", "--torch-dtype", "bfloat16", "--no-on-device-sampling", "--max-topk", "64",
        "--instance-type", "trn2", "--backend", "cpu", "--overwrite", "out",
    )  # fmt: skip
    underscored = parse(
        "--model", "m", "--batch_size", "2", "--sequence_length", "512", "--prefill_chunk_size", "128",
        "--tensor_parallel_size", "2", "--torch_dtype", "bfloat16", "--no_on_device_sampling", "--max_topk", "64",
        "--instance_type", "trn2", "--backend", "cpu", "--overwrite", "out",
    )  # fmt: skip
    assert vars(dashed) == vars(underscored)
    config = request_from_args(dashed).neuron_config
    assert (config.batch_size, config.sequence_length, config.prefill_chunk_size) == (2, 512, 128)
    assert (config.tp_degree, config.torch_dtype, config.on_device_sampling) == (2, "bfloat16", False)
    assert (config.max_topk, config.target, config.backend) == (64, "trn2", "cpu")


def test_on_device_sampling_flags():
    assert parse(*BASE).on_device_sampling is True
    assert parse("--on-device-sampling", *BASE).on_device_sampling is True
    assert parse("--no-on-device-sampling", *BASE).on_device_sampling is False
    assert parse("--no-on-device-sampling", "--on_device_sampling", *BASE).on_device_sampling is True


@pytest.mark.parametrize(
    ("backend", "sequence_length", "chunk", "expected"),
    [
        ("neuron", 64, None, 0),
        ("neuron", 1024, None, 0),
        ("neuron", 1025, None, 1024),
        ("neuron", 4096, None, 1024),
        ("cpu", 256, None, 0),
        ("cpu", 257, None, 256),
        ("cpu", 4096, None, 256),
        ("cpu", 4096, 512, 512),
        ("neuron", 4096, 0, 0),
    ],
)
def test_automatic_chunk_size(backend, sequence_length, chunk, expected):
    assert resolve_chunk_size(chunk, sequence_length, backend) == expected
    argv = ["--model", "m", "--batch-size", "1", "--sequence-length", str(sequence_length), "--backend", backend, "o"]
    if chunk is not None:
        argv[:0] = ["--prefill-chunk-size", str(chunk)]
    assert request_from_args(parse(*argv)).neuron_config.prefill_chunk_size == expected


def test_default_dtype_follows_backend():
    assert resolve_dtype(None, "neuron") == "bfloat16"
    assert resolve_dtype(None, "cpu") == "float32"
    assert resolve_dtype("float16", "neuron") == "float16"
    assert request_from_args(parse("--backend", "neuron", *BASE)).neuron_config.torch_dtype == "bfloat16"
    assert request_from_args(parse("--backend", "cpu", *BASE)).neuron_config.torch_dtype == "float32"
    assert parse("--torch-dtype", "bf16", *BASE).torch_dtype == "bfloat16"
    assert parse("--torch-dtype", "torch.float16", *BASE).torch_dtype == "float16"


def test_auto_backend_is_cpu_without_neuron_devices():
    expected = "neuron" if neuron_devices_present() else "cpu"
    assert request_from_args(parse(*BASE)).neuron_config.backend == expected


def test_registered_under_optimum_cli_export():
    listing = subprocess.run([str(OPTIMUM_CLI), "export", "--help"], capture_output=True, text=True, cwd="/")
    assert listing.returncode == 0 and "neuron" in listing.stdout
    helped = subprocess.run([str(OPTIMUM_CLI), "export", "neuron", "--help"], capture_output=True, text=True, cwd="/")
    assert helped.returncode == 0, helped.stderr
    for option in ("--prefill-chunk-size", "--prefill_chunk_size", "--no-on-device-sampling", "--instance-type"):
        assert option in helped.stdout


def test_register_namespace_has_no_init_files():
    # optimum finds commands in the PEP 420 namespace optimum.commands.register: an __init__.py anywhere on the
    # way would shadow the installed optimum package.
    for folder in ("optimum", "optimum/commands", "optimum/commands/register"):
        assert not (REPO / folder / "__init__.py").exists(), folder
    register = (REPO / "optimum/commands/register/register_neuron_plugin.py").read_text()
    assert "REGISTER_COMMANDS" in register


def test_speculative_tokens():
    assert request_from_args(parse(*BASE)).neuron_config.speculative_tokens == 0
    config = request_from_args(parse("--speculative-tokens", "4", *BASE)).neuron_config
    assert config.speculative_tokens == 4


def test_max_logit_bias_is_recorded_with_the_config_default():
    from optimum_neuron_plugin.config import NeuronConfig

    assert request_from_args(parse(*BASE)).neuron_config.max_logit_bias == NeuronConfig().max_logit_bias == 32
    assert request_from_args(parse("--max-logit-bias", "0", *BASE)).neuron_config.max_logit_bias == 0


def test_prefill_tail_size_reaches_the_config():
    argv = ["--model", "m", "--batch-size", "2", "--sequence-length", "512", "--prefill-chunk-size", "128", "o"]
    assert request_from_args(parse("--prefill_tail_size", "64", *argv)).neuron_config.prefill_tail_size == 64
    assert request_from_args(parse(*argv)).neuron_config.prefill_tail_size == 0


def test_argument_checks_import_no_torch():
    """Options are resolved and checked without importing torch (seconds per start): a refused option or a missing
    model costs a fraction of a second."""
    code = (
        "import sys; from exporter.cli import build_parser, request_from_args; "
        "request_from_args(build_parser().parse_args(['--model', 'm', '--batch-size', '2', '--sequence-length', "
        "'64', '--backend', 'auto', 'out'])); print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]"]
