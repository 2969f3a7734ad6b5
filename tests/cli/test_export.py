"""The real `optimum-cli export neuron` in a subprocess, on tiny random-weight models (SmolLM2's export, the session's:
tests/core/test_smollm2.py).

Successful exports must load with NeuronModelForCausalLM.from_pretrained and generate HF transformers' greedy
tokens; every refused input must exit non-zero with one `error:` line, no traceback, and leave nothing behind. The
refusals found only by reading the model run the command in this process (export_in_process: a subprocess would
import torch and transformers again, seconds each); the others run the real optimum-cli.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from support.exports import assert_same_greedy, load_hf, neuron_config, prompt_ids
from support.smollm2 import smollm2_gguf

from .helpers import INFO_CLI, cli_env, export_in_process, leftovers, run_export

# ----------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------


def assert_refused(result, output: Path, *phrases: str, returncode: int = 1) -> str:
    """Non-zero exit, exactly one `error:` line holding every phrase, no traceback, nothing left behind."""
    assert result.returncode == returncode, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert len(result.error_lines) == 1, result.stderr
    line = result.error_lines[0]
    for phrase in phrases:
        assert phrase.lower() in line.lower(), line
    assert not output.exists(), sorted(output.iterdir()) if output.is_dir() else output
    assert leftovers(output.parent) == []
    return line


def tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


TINY_ARGS = ["--batch-size", "2", "--sequence-length", "64", "--backend", "cpu"]
# llama_export's options: the other exports of the tiny Llama with these options reuse its compiled graphs.
LLAMA_EXPORT_ARGS = [
    *TINY_ARGS, "--prefill-chunk-size", "16", "--context-buckets", "32,64", "--prefill-buckets", "0,64",
    "--decode-batch-sizes", "2",
]  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# successful exports
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_export(tiny_models, tmp_path_factory) -> tuple[Path, object]:
    """One chunked export of the tiny Llama for two context buckets and two prefill buckets, shared by several
    tests."""
    output = tmp_path_factory.mktemp("llama") / "exported"
    result = run_export("--model", tiny_models["llama"], *LLAMA_EXPORT_ARGS, output)
    assert result.returncode == 0, result.stderr
    return output, result


def test_export_tiny_llama_chunked_matches_hf(llama_export, tiny_models):
    output, result = llama_export
    files = set(tree(output))
    for name in ("config.json", "neuron_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert name in files, sorted(files)
    graphs = sorted(f for f in files if f.startswith("graphs/"))
    kinds = ("chunk_and_decode", "token_generation")
    expected = [f"{graph}_{bucket}.pt2" for graph in kinds for bucket in (32, 64)]
    expected = sorted(expected + ["chunked_prefill_0.pt2", "chunked_prefill_64.pt2"])
    assert [Path(g).name for g in graphs] == expected, graphs
    assert [f for f in files if f.endswith(".safetensors")] == ["model.safetensors"]  # weights once
    # progress and summary
    assert "[export]" in result.stdout and "chunked_prefill" in result.stdout
    assert f"Exported {tiny_models['llama']}" in result.stdout
    assert leftovers(output.parent) == []

    config = neuron_config(output)
    assert config["batch_size"] == 2 and config["sequence_length"] == 64 and config["prefill_chunk_size"] == 16
    assert config["backend"] == "cpu" and config["torch_dtype"] == "float32" and config["tp_degree"] == 1
    assert config["on_device_sampling"] is True and config["max_topk"] == 256 and config["target"] is None
    assert config["context_buckets"] == [32, 64] and config["cpu_compiler"] == "export"
    assert config["prefill_buckets"] == [0, 64]
    assert config["decode_batch_sizes"] == [2]  # no one-row token_generation: as asked
    assert config["optimum_neuron_plugin_version"]
    assert config["compiler"]["name"] and config["compiler"]["version"]

    ids = prompt_ids(tiny_models["llama"])
    assert len(ids) > 2 * 16  # several chunks
    assert_same_greedy(output, load_hf(tiny_models["llama"]), ids, eos=set())


def test_export_is_deterministic_and_overwrite_replaces_a_non_empty_directory(llama_export, tiny_models, tmp_path):
    first, second = llama_export[0], tmp_path / "again"
    second.mkdir()
    (second / "stale.txt").write_text("from a previous export")
    result = run_export("--model", tiny_models["llama"], *LLAMA_EXPORT_ARGS, "--overwrite", second)
    assert result.returncode == 0, result.stderr
    assert not (second / "stale.txt").exists()
    for name in ("neuron_config.json", "model.safetensors", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert leftovers(tmp_path) == []


def test_empty_existing_directory_and_missing_parents_are_fine(tiny_models, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    nested = tmp_path / "a" / "b" / "out"
    for output in (empty, nested):
        result = export_in_process(
            "--model", tiny_models["llama"], "--batch-size", "1", "--sequence-length", "32", output
        )
        assert result.returncode == 0, result.stderr
        assert (output / "neuron_config.json").is_file()
    assert leftovers(tmp_path) == []


def test_info_command_describes_an_export(llama_export, tmp_path):
    output, _ = llama_export
    done = subprocess.run([str(INFO_CLI), str(output)], capture_output=True, text=True, env=cli_env())
    assert done.returncode == 0, done.stderr
    for text in (
        "LlamaForCausalLM",
        "prefill_chunk_size: 16",
        "chunked_prefill",
        "token_generation",
        "model.safetensors",
        "memory per rank (tensor parallel 1):",
        "(cpu backend: information only, no device limit)",
    ):
        assert text in done.stdout
    refused = subprocess.run([str(INFO_CLI), str(tmp_path)], capture_output=True, text=True, env=cli_env())
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error:") and "neuron_config.json" in refused.stderr


# ----------------------------------------------------------------------------------------------------------------
# refused inputs: exit code, one-line message, nothing left behind
# ----------------------------------------------------------------------------------------------------------------


def test_missing_model_path(tmp_path):
    output = tmp_path / "out"
    for model in (tmp_path / "nope", tmp_path / "nope.gguf", "./relative/missing"):
        assert_refused(run_export("--model", model, *TINY_ARGS, output), output, "not found")


def test_model_directory_without_config(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "README.md").write_text("not a model")
    output = tmp_path / "out"
    assert_refused(run_export("--model", tmp_path / "model", *TINY_ARGS, output), output, "config.json")


def test_unreadable_model_config(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{ this is not json")
    output = tmp_path / "out"
    assert_refused(export_in_process("--model", model, *TINY_ARGS, output), output, "cannot read model")


def test_corrupt_weights(tiny_models, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_models["llama"], model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    output = tmp_path / "out"
    assert_refused(export_in_process("--model", model, *TINY_ARGS, output), output, "weights")


def test_corrupt_gguf(tmp_path):
    real = smollm2_gguf().read_bytes()
    output = tmp_path / "out"
    # a bare header, a download cut in the metadata, a download cut in the tensors
    for size in (12, 4096, 3_000_000):
        gguf = tmp_path / f"broken-{size}.gguf"
        gguf.write_bytes(real[:size])
        assert_refused(export_in_process("--model", gguf, *TINY_ARGS, output), output, gguf.name)


def test_unsupported_architecture(tiny_models, tmp_path):
    output = tmp_path / "out"
    line = assert_refused(
        export_in_process("--model", tiny_models["gpt2"], *TINY_ARGS, output), output, "GPT2LMHeadModel"
    )
    for supported in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                      "Gemma3ForCausalLM", "GraniteForCausalLM", "Phi3ForCausalLM", "SmolLM3ForCausalLM"):  # fmt: skip
        assert supported in line


def test_chunk_larger_than_sequence_length(tiny_llama, tmp_path):
    output = tmp_path / "out"
    result = run_export("--model", tiny_llama, *TINY_ARGS, "--prefill-chunk-size", "128", output)
    assert_refused(result, output, "prefill_chunk_size=128", "sequence_length (64)")


def test_sequence_length_above_max_positions(tiny_llama, tmp_path):
    output = tmp_path / "out"
    result = export_in_process("--model", tiny_llama, "--batch-size", "1", "--sequence-length", "256", output)
    assert_refused(result, output, "sequence_length=256", "max_position_embeddings (128)")


@pytest.mark.parametrize("batch_size", ["0", "-2"])
def test_batch_size_below_one(tiny_llama, tmp_path, batch_size):
    output = tmp_path / "out"
    result = run_export("--model", tiny_llama, "--batch-size", batch_size, "--sequence-length", "64", output)
    assert_refused(result, output, f"batch_size={batch_size}", ">= 1")


def test_tensor_parallel_size_the_model_cannot_be_split_by(tiny_llama, tmp_path):
    output = tmp_path / "out"
    result = export_in_process("--model", tiny_llama, *TINY_ARGS, "--tensor-parallel-size", "3", output)
    assert_refused(result, output, "tp_degree=3", "attention heads (4)")


def test_non_empty_output_without_overwrite(tiny_llama, tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("precious")
    result = run_export("--model", tiny_llama, *TINY_ARGS, output)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(result.error_lines) == 1 and "--overwrite" in result.error_lines[0]
    assert tree(output) == {"keep.txt": b"precious"}
    assert leftovers(tmp_path) == []


def test_failed_overwrite_keeps_the_existing_output(tiny_models, tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("previous export")
    result = export_in_process("--model", tiny_models["gpt2"], *TINY_ARGS, "--overwrite", output)
    assert result.returncode == 1 and len(result.error_lines) == 1 and "not supported" in result.error_lines[0]
    assert tree(output) == {"keep.txt": b"previous export"}
    assert leftovers(tmp_path) == []


def test_output_is_a_file(tiny_llama, tmp_path):
    output = tmp_path / "out"
    output.write_text("a file")
    result = run_export("--model", tiny_llama, *TINY_ARGS, "--overwrite", output)
    assert result.returncode == 1 and len(result.error_lines) == 1 and "not a directory" in result.error_lines[0]
    assert output.read_text() == "a file"
    assert leftovers(tmp_path) == []


def test_output_overlapping_the_model(tiny_models, tmp_path):
    # --overwrite must never delete the model being exported: OUTPUT may not be it or one of its ancestors.
    model = tmp_path / "models" / "model"
    shutil.copytree(tiny_models["llama"], model)
    before = tree(model)
    for output in (model, model.parent):
        result = run_export("--model", model, *TINY_ARGS, "--overwrite", output)
        assert result.returncode == 1 and len(result.error_lines) == 1, result.stderr
        assert "overlaps the model" in result.error_lines[0]
    assert tree(model) == before


def test_offline_hub_id(tmp_path):
    output = tmp_path / "out"
    result = run_export("--model", "HuggingFaceTB/SmolLM2-135M-Instruct", *TINY_ARGS, output)
    assert_refused(result, output, "HuggingFaceTB/SmolLM2-135M-Instruct", "cannot be downloaded", "HF_HUB_OFFLINE")


def test_neuron_backend_without_sdk(tiny_llama, tmp_path):
    pytest.importorskip("optimum_neuron_plugin.backends.neuron")
    try:
        import torch_neuronx  # noqa: F401

        pytest.skip("the Neuron SDK is installed")
    except ImportError:
        pass
    output = tmp_path / "out"
    result = export_in_process(
        "--model", tiny_llama, "--batch-size", "1", "--sequence-length", "64", "--backend", "neuron",
        "--instance-type", "trn2", output,
    )  # fmt: skip
    assert_refused(result, output, "torch-neuronx", "neuronx-cc", '.[neuron]"', "--backend cpu")
    assert "loading weights" not in result.stdout  # refused before any weight is read


@pytest.mark.parametrize("instance", ["inf2", "trn1"])
def test_neuron_instance_types_before_trn2_are_refused(tiny_llama, tmp_path, instance):
    output = tmp_path / "out"
    result = run_export(
        "--model", tiny_llama, "--batch-size", "1", "--sequence-length", "64", "--backend", "neuron",
        "--instance-type", instance, output,
    )  # fmt: skip
    assert_refused(result, output, f"target='{instance}'", "trn2 and trn3", "SDK 2.31", "optimum-neuron")


def test_unknown_instance_type_is_refused(tiny_llama, tmp_path):
    output = tmp_path / "out"
    result = run_export(
        "--model", tiny_llama, "--batch-size", "1", "--sequence-length", "64", "--backend", "neuron",
        "--instance-type", "p4d", output,
    )  # fmt: skip
    assert_refused(result, output, "target='p4d'", "trn2")


def test_invalid_option_values_are_argparse_errors(tiny_llama, tmp_path):
    output = tmp_path / "out"
    for bad in (["--torch-dtype", "int8"], ["--backend", "gpu"], ["--batch-size", "x"]):
        result = run_export("--model", tiny_llama, "--batch-size", "1", "--sequence-length", "64", *bad, output)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert not output.exists()


@pytest.mark.parametrize(
    ("sizes", "phrases"),
    [("1,3", ("decode_batch_sizes=[1, 3]", "ending with batch_size (2)")), ("2,1", ("strictly increasing",))],
)
def test_decode_batch_sizes_the_batch_cannot_use(tiny_llama, tmp_path, sizes, phrases):
    output = tmp_path / "out"
    result = run_export("--model", tiny_llama, *TINY_ARGS, "--decode-batch-sizes", sizes, output)
    assert_refused(result, output, *phrases)


def test_decode_buckets_that_miss_the_sequence_length(tiny_llama, tmp_path):
    output = tmp_path / "out"
    result = run_export("--model", tiny_llama, *TINY_ARGS, "--decode-buckets", "16,32", output)
    assert_refused(result, output, "decode_buckets=[16, 32]", "ending with sequence_length (64)")


def test_decode_batch_sizes_that_are_not_numbers(tiny_llama, tmp_path):
    output = tmp_path / "out"
    result = run_export("--model", tiny_llama, *TINY_ARGS, "--decode-batch-sizes", "1,two", output)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "'1,two' is not a comma-separated list of row counts, e.g. 1,4" in result.stderr
    assert not output.exists()


def test_max_topk_below_one(tiny_llama, tmp_path):
    output = tmp_path / "out"
    result = run_export("--model", tiny_llama, *TINY_ARGS, "--max-topk", "0", output)
    assert_refused(result, output, "max_topk=0")


def test_prompt_logprobs_option_is_recorded_and_needs_chunks(tmp_path):
    from exporter.cli import build_parser, request_from_args
    from optimum_neuron_plugin.config import NeuronConfigError

    base = ["--model", "m", "--batch-size", "1", "--sequence-length", "64", "--backend", "cpu", str(tmp_path)]
    parser = build_parser()
    assert request_from_args(parser.parse_args(base)).neuron_config.prompt_logprobs is False
    chunked = request_from_args(parser.parse_args([*base, "--prefill-chunk-size", "16", "--prompt-logprobs"]))
    assert chunked.neuron_config.prompt_logprobs is True
    with pytest.raises(NeuronConfigError, match="prompt_logprobs=True is not allowed: must be false without chunked"):
        request_from_args(parser.parse_args([*base, "--prompt-logprobs"]))
