"""Bad runtime inputs raise InputError and damaged artifacts raise ArtifactError, saying what to change."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from optimum_neuron_plugin import ArtifactError, InputError, NeuronModelForCausalLM
from optimum_neuron_plugin.config import NEURON_CONFIG_FILE

from .helpers import SEQUENCE_LENGTH, prompt


def unchanged(model):
    """Context check: a rejected call leaves the KV cache as it was."""
    before = [cache.clone() for cache in model.caches]

    class Check:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            assert all(torch.equal(a, b) for a, b in zip(before, model.caches, strict=True)), "the cache changed"

    return Check()


def test_prompt_longer_than_sequence_length(llama_logits):
    model = llama_logits.model
    with unchanged(model), pytest.raises(InputError) as error:
        model.prefill(0, prompt(SEQUENCE_LENGTH + 1, seed=1))
    assert f"sequence_length {SEQUENCE_LENGTH}" in str(error.value) and "--sequence-length" in str(error.value)
    with unchanged(model), pytest.raises(InputError, match="sequence_length"):
        model.prefill(0, prompt(10, seed=1), start=SEQUENCE_LENGTH - 5)
    # generate needs room for at least one new token.
    with unchanged(model), pytest.raises(InputError) as error:
        model.generate(torch.tensor([prompt(SEQUENCE_LENGTH, seed=2)]), max_new_tokens=2)
    assert f"{SEQUENCE_LENGTH} tokens" in str(error.value) and "--sequence-length" in str(error.value)


def test_more_sequences_than_batch_size(llama_logits):
    model = llama_logits.model  # batch_size 3
    with unchanged(model), pytest.raises(InputError) as error:
        model.generate(torch.tensor([prompt(6, seed=s) for s in range(4)]), max_new_tokens=2)
    assert "4 sequences" in str(error.value) and "batch_size 3" in str(error.value)
    with unchanged(model), pytest.raises(InputError) as error:
        model.decode([0, 1, 2, 0], [1, 2, 3, 4], [5, 5, 5, 5])
    assert "4 sequences" in str(error.value) and "batch_size 3" in str(error.value)


@pytest.mark.parametrize("seq_id", [3, -1, 100])
def test_seq_id_out_of_range(llama_logits, seq_id):
    model = llama_logits.model
    with unchanged(model), pytest.raises(InputError) as error:
        model.prefill(seq_id, prompt(5, seed=3))
    assert f"seq_id {seq_id}" in str(error.value) and "0..2" in str(error.value)
    with unchanged(model), pytest.raises(InputError, match=f"seq_id {seq_id}"):
        model.decode([0, seq_id], [1, 2], [5, 5])


def test_duplicate_seq_ids(llama_logits):
    model = llama_logits.model
    with unchanged(model), pytest.raises(InputError, match="duplicate seq_ids"):
        model.decode([1, 1], [3, 4], [5, 6])


def test_decode_position_out_of_range_and_mismatched_lengths(llama_logits):
    model = llama_logits.model
    with unchanged(model), pytest.raises(InputError, match="sequence_length"):
        model.decode([0], [1], [SEQUENCE_LENGTH])
    with unchanged(model), pytest.raises(InputError, match="one token, position"):
        model.decode([0, 1], [1], [4, 4])
    with unchanged(model), pytest.raises(InputError, match="empty prompt"):
        model.generate(torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[0, 0, 0]]))
    with unchanged(model), pytest.raises(InputError, match="at least one token"):
        model.prefill(0, [])


def test_input_errors_are_value_errors():
    assert issubclass(InputError, ValueError) and issubclass(ArtifactError, ValueError)


# ---- damaged artifacts ----------------------------------------------------------------------------


@pytest.fixture
def artifact_copy(llama_logits, tmp_path):
    target = tmp_path / "artifact"
    shutil.copytree(llama_logits.path, target)
    return target


def test_intact_copy_loads(artifact_copy):
    model = NeuronModelForCausalLM.from_pretrained(artifact_copy)
    assert model.neuron_config.prefill_chunk_size == 8


@pytest.mark.parametrize("graph", ["chunked_prefill_8", "token_generation_64"])
def test_missing_graph_file(artifact_copy, graph):
    (artifact_copy / "graphs" / f"{graph}.pt2").unlink()
    with pytest.raises(ArtifactError) as error:
        NeuronModelForCausalLM.from_pretrained(artifact_copy)
    assert f"{graph}.pt2" in str(error.value) and "export" in str(error.value)


def test_truncated_weights(artifact_copy):
    weights = artifact_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ArtifactError) as error:
        NeuronModelForCausalLM.from_pretrained(artifact_copy)
    assert "model.safetensors" in str(error.value) and "export" in str(error.value)


def test_missing_weights(artifact_copy):
    (artifact_copy / "model.safetensors").unlink()
    with pytest.raises(ArtifactError, match="model.safetensors"):
        NeuronModelForCausalLM.from_pretrained(artifact_copy)


def test_missing_config(artifact_copy):
    (artifact_copy / "config.json").unlink()
    with pytest.raises(ArtifactError) as error:
        NeuronModelForCausalLM.from_pretrained(artifact_copy)
    assert "config.json" in str(error.value) and NEURON_CONFIG_FILE not in str(error.value)


def test_newer_neuron_config(artifact_copy):
    path = artifact_copy / NEURON_CONFIG_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "format_version": 99}))
    with pytest.raises(ArtifactError) as error:
        NeuronModelForCausalLM.from_pretrained(artifact_copy)
    assert NEURON_CONFIG_FILE in str(error.value) and "99" in str(error.value)


def test_truncated_graph_file(artifact_copy):
    graph = artifact_copy / "graphs" / "token_generation_32.pt2"
    graph.write_bytes(graph.read_bytes()[:1000])
    with pytest.raises(ArtifactError) as error:
        NeuronModelForCausalLM.from_pretrained(artifact_copy)
    assert "graphs" in str(error.value)


def test_not_a_directory(tmp_path):
    with pytest.raises(ArtifactError, match="not a directory"):
        NeuronModelForCausalLM.from_pretrained(tmp_path / "nowhere")
