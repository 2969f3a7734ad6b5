"""NeuronConfig: validation messages name the field, the value and what is allowed; JSON round trip."""

from __future__ import annotations

import json

import pytest

from optimum_neuron_plugin import NeuronConfig, NeuronConfigError, NeuronModelForCausalLM
from optimum_neuron_plugin.config import FORMAT_VERSION, NEURON_CONFIG_FILE

BAD_VALUES = [
    # (field, value, other fields, words of what is allowed)
    ("batch_size", 0, {}, ">= 1"),
    ("batch_size", -2, {}, ">= 1"),
    ("batch_size", 1.5, {}, "integer"),
    ("batch_size", True, {}, "integer"),
    ("sequence_length", 0, {}, ">= 1"),
    ("tp_degree", 0, {}, ">= 1"),
    ("max_topk", -1, {}, ">= 1"),
    ("prefill_chunk_size", -8, {}, ">= 0"),
    ("prefill_chunk_size", 512, {"sequence_length": 256}, "sequence_length (256)"),
    ("torch_dtype", "float64", {}, "float32, bfloat16, float16"),
    ("backend", "tpu", {}, "cpu, neuron"),
    ("target", "v100", {}, "trn2, trn3"),
    ("on_device_sampling", "yes", {}, "true or false"),
    ("speculative_tokens", -1, {}, ">= 0"),
    ("speculative_tokens", 64, {"sequence_length": 64}, "below sequence_length (64)"),
    ("prompt_logprobs", True, {"prefill_chunk_size": 0}, "false without chunked prefill"),
    ("max_logit_bias", -1, {}, ">= 0 (0: no logit_bias input)"),
]


@pytest.mark.parametrize(
    ("field", "value", "others", "allowed"), BAD_VALUES, ids=[f"{f}={v!r}" for f, v, _, _ in BAD_VALUES]
)
def test_bad_value_names_field_value_and_allowed(field, value, others, allowed):
    with pytest.raises(NeuronConfigError) as error:
        NeuronConfig(**{**others, field: value})
    message = str(error.value)
    assert field in message
    assert repr(value) in message
    assert allowed in message


def test_good_values_are_accepted():
    config = NeuronConfig(batch_size=4, sequence_length=256, prefill_chunk_size=256, torch_dtype="bfloat16")
    assert config.chunked and config.prefill_length == 256 and config.prefill_graph == "chunked_prefill"
    unchunked = NeuronConfig(sequence_length=128, prefill_chunk_size=0)
    assert not unchunked.chunked and unchunked.prefill_length == 128 and unchunked.prefill_graph == "context_encoding"


def test_errors_are_value_errors():
    assert issubclass(NeuronConfigError, ValueError)


def test_sequence_length_above_max_position_embeddings_fails_at_export(zoo):
    tiny = zoo.tiny("llama")  # max_position_embeddings 128
    with pytest.raises(NeuronConfigError) as error:
        NeuronModelForCausalLM.export(tiny.path, NeuronConfig(sequence_length=256, prefill_chunk_size=32))
    message = str(error.value)
    assert "sequence_length" in message and "256" in message and "max_position_embeddings (128)" in message


def test_tp_degree_must_divide_the_heads(zoo):
    tiny = zoo.tiny("llama")  # 4 attention heads, 2 kv heads
    with pytest.raises(NeuronConfigError) as error:
        NeuronModelForCausalLM.export(tiny.path, NeuronConfig(sequence_length=64, tp_degree=3))
    assert "tp_degree=3" in str(error.value) and "(4)" in str(error.value)


def test_json_round_trip(tmp_path):
    config = NeuronConfig(
        batch_size=3,
        sequence_length=512,
        prefill_chunk_size=64,
        tp_degree=2,
        torch_dtype="bfloat16",
        on_device_sampling=False,
        max_topk=32,
        target="trn2",
        backend="neuron",
    )
    config.save(tmp_path, compiler={"name": "x"})
    data = json.loads((tmp_path / NEURON_CONFIG_FILE).read_text())
    assert data["format_version"] == FORMAT_VERSION and data["compiler"] == {"name": "x"}
    assert NeuronConfig.load(tmp_path) == config
    assert NeuronConfig.from_dict(config.to_dict()) == config


def write_config(tmp_path, **changes):
    NeuronConfig(sequence_length=128, prefill_chunk_size=32).save(tmp_path)
    path = tmp_path / NEURON_CONFIG_FILE
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return path


def test_newer_format_version_names_the_file(tmp_path):
    write_config(tmp_path, format_version=FORMAT_VERSION + 1)
    with pytest.raises(NeuronConfigError) as error:
        NeuronConfig.load(tmp_path)
    message = str(error.value)
    assert NEURON_CONFIG_FILE in message and f"format_version {FORMAT_VERSION + 1}" in message and "upgrade" in message


def test_older_format_version_asks_for_a_new_export(tmp_path):
    write_config(tmp_path, format_version=FORMAT_VERSION - 1)
    with pytest.raises(NeuronConfigError) as error:
        NeuronConfig.load(tmp_path)
    message = str(error.value)
    assert (
        NEURON_CONFIG_FILE in message
        and f"format_version {FORMAT_VERSION - 1}" in message
        and "export the model again" in message
    )


def test_missing_field_names_the_file_and_field(tmp_path):
    write_config(tmp_path, batch_size=None)
    with pytest.raises(NeuronConfigError) as error:
        NeuronConfig.load(tmp_path)
    message = str(error.value)
    assert NEURON_CONFIG_FILE in message and "batch_size" in message


def test_speculative_tokens_may_be_absent_from_the_file(tmp_path):
    """Exports without verify graphs load whether or not their neuron_config.json names speculative_tokens."""
    write_config(tmp_path, speculative_tokens=None)
    assert NeuronConfig.load(tmp_path).speculative_tokens == 0
    write_config(tmp_path, speculative_tokens=3)
    assert NeuronConfig.load(tmp_path).speculative_tokens == 3


def test_a_file_without_prompt_logprobs_has_no_prompt_logits_graphs(tmp_path):
    write_config(tmp_path, prompt_logprobs=None)
    assert NeuronConfig.load(tmp_path).prompt_logprobs is False


def test_a_file_without_decode_buckets_decodes_in_its_context_buckets(tmp_path):
    write_config(tmp_path, decode_buckets=None, context_buckets=[64, 128])
    config = NeuronConfig.load(tmp_path)
    assert config.decode_buckets == config.context_buckets == (64, 128)
    write_config(tmp_path, decode_buckets=[32, 96, 128], context_buckets=[64, 128])
    assert NeuronConfig.load(tmp_path).decode_buckets == (32, 96, 128)


def test_bad_value_in_file_names_the_file(tmp_path):
    write_config(tmp_path, prefill_chunk_size=4096)
    with pytest.raises(NeuronConfigError) as error:
        NeuronConfig.load(tmp_path)
    message = str(error.value)
    assert NEURON_CONFIG_FILE in message and "prefill_chunk_size=4096" in message


def test_missing_or_corrupt_file_names_the_file(tmp_path):
    with pytest.raises(NeuronConfigError, match=NEURON_CONFIG_FILE):
        NeuronConfig.load(tmp_path)
    (tmp_path / NEURON_CONFIG_FILE).write_text("{not json")
    with pytest.raises(NeuronConfigError, match=NEURON_CONFIG_FILE):
        NeuronConfig.load(tmp_path)
