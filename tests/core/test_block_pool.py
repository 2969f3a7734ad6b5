"""The KV cache as a pool of blocks: greedy tokens equal transformers' at every block size (one position per block
through one block per sequence), a row reads only its own blocks (garbage elsewhere changes nothing, bit for bit),
a pool smaller than batch x sequence_length serves what fits and says what to change when it is full, and an
artifact of the previous format is refused with the command that exports it again."""

from __future__ import annotations

import json

import pytest
import torch
from support.references import hf_greedy

from optimum_neuron_plugin import NeuronConfig
from optimum_neuron_plugin.config import NeuronConfigError
from optimum_neuron_plugin.errors import InputError

from .helpers import CHUNKED_LOGITS_LIGHT, SEQUENCE_LENGTH, prompt

STEPS = 6


def greedy(model, seq_id: int, tokens: list[int], steps: int = STEPS) -> list[int]:
    out = [int(model.prefill(seq_id, tokens).argmax())]
    for step in range(steps - 1):
        out.append(model.decode([seq_id], [out[-1]], [len(tokens) + step]).tokens[0])
    return out


@pytest.mark.parametrize("block_size", [1, 4, 8, SEQUENCE_LENGTH])
def test_greedy_matches_hf_at_every_block_size(zoo, block_size):
    artifact = zoo.artifact("llama", **CHUNKED_LOGITS_LIGHT, block_size=block_size)
    model = artifact.model
    assert model.caches[0].shape[:2] == (3 * SEQUENCE_LENGTH // block_size + 1, block_size)
    prompts = {0: prompt(21, seed=70), 2: prompt(9, seed=71), 1: prompt(40, seed=72)}
    for seq_id, tokens in prompts.items():  # slots grow side by side: their blocks interleave in the pool
        assert greedy(model, seq_id, tokens) == hf_greedy(artifact.hf, tokens, STEPS)


def test_rows_read_only_their_own_blocks(zoo):
    """Garbage in every block slot 0 does not own (the null block and other slots' blocks) leaves slot 0's prefill
    chunk and decode logits unchanged, bit for bit."""
    model = zoo.artifact("llama", **CHUNKED_LOGITS_LIGHT, block_size=4).model
    model.prefill(1, prompt(30, seed=73))
    model.prefill(0, prompt(13, seed=74))
    owned = set(model.graph_set.tables.table[0].tolist()) - {0}
    saved = [cache.clone() for cache in model.caches]

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        decoded = model.decode([0, 1], [5, 6], [13, 30]).logits[0]
        chunk = model.prefill(0, prompt(9, seed=75), start=14)
        for cache, copy in zip(model.caches, saved, strict=True):
            cache.copy_(copy)
        return decoded, chunk

    clean = step()
    generator = torch.Generator().manual_seed(0)
    for cache in model.caches:
        for block in set(range(cache.shape[0])) - owned:
            cache[block] = torch.randn(cache.shape[1:], generator=generator) * 100
    noisy = step()
    for want, got in zip(clean, noisy, strict=True):
        assert torch.equal(want, got)


def test_a_pool_smaller_than_the_batch_serves_what_fits_and_says_when_it_is_full(zoo):
    blocks_per_sequence = SEQUENCE_LENGTH // 8
    artifact = zoo.artifact("llama", **CHUNKED_LOGITS_LIGHT, block_size=8, num_blocks=blocks_per_sequence + 1)
    model = artifact.model
    short = {0: prompt(20, seed=76), 1: prompt(18, seed=77), 2: prompt(11, seed=78)}
    for seq_id, tokens in short.items():  # 3 + 3 + 2 blocks of the 8: all three fit
        assert greedy(model, seq_id, tokens, 3) == hf_greedy(artifact.hf, tokens, 3)
    with pytest.raises(InputError, match=r"KV cache pool is full: its 8 blocks of 8 positions.*--num-blocks"):
        model.prefill(2, prompt(40, seed=79))  # 5 blocks, with 8 - 3 - 3 = 2 free after slot 2's release
    tokens = prompt(38, seed=80)  # 5 blocks with its 2 decode steps: slot 0's own, freed by its restart, and slot 2's
    assert greedy(model, 0, tokens, 3) == hf_greedy(artifact.hf, tokens, 3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(block_size=6), r"block_size=6 is not allowed: must be a divisor of sequence_length.* 8 is"),
        (dict(block_size=0), r"block_size=0 is not allowed"),
        (dict(block_size=8, num_blocks=8), r"num_blocks=8 is not allowed: must be an integer >= 9"),
    ],
)
def test_bad_block_options_say_what_to_change(fields, message):
    with pytest.raises(NeuronConfigError, match=message):
        NeuronConfig(batch_size=2, sequence_length=SEQUENCE_LENGTH, prefill_chunk_size=8, **fields)


def test_an_artifact_of_the_previous_format_is_refused_with_its_export_command(tmp_path):
    config = NeuronConfig(batch_size=4, sequence_length=SEQUENCE_LENGTH, prefill_chunk_size=8).to_dict()
    for field in ("block_size", "num_blocks"):
        del config[field]
    (tmp_path / "neuron_config.json").write_text(json.dumps({"format_version": 7, **config}))
    (tmp_path / "config.json").write_text(json.dumps({"_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}))
    expected = (
        "optimum-cli export neuron --model HuggingFaceTB/SmolLM2-135M-Instruct --batch-size 4 --sequence-length 64 "
        f"--prefill-chunk-size 8 {tmp_path}"
    )
    with pytest.raises(NeuronConfigError, match="pool of blocks") as error:
        NeuronConfig.load(tmp_path)
    assert expected in str(error.value)
