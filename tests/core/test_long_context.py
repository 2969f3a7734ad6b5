"""Long contexts: a tiny Llama 3 (llama3 rope scaling) exported for 32,768 positions, structurally — its buckets,
its rope frequencies, a 5,000-token prompt's logits against HF eager, and a chunk starting in the top prior
bucket (finite)."""

from __future__ import annotations

import pytest
import torch
from support.references import hf_last_logits
from support.tiny_models import tiny_model

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.models.layers import rope_inv_freq

from .helpers import VOCAB, eager_pool, prompt

LENGTH, CHUNK = 32768, 2048


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory):
    hf = tiny_model("llama3", seed=1, vocab_size=VOCAB, max_position_embeddings=LENGTH)
    root = tmp_path_factory.mktemp("long-context")
    hf.save_pretrained(root / "hf")
    # Fewer buckets than the default (6 graphs instead of 13): the export stays a few seconds.
    config = NeuronConfig(
        batch_size=1, sequence_length=LENGTH, prefill_chunk_size=CHUNK, prefill_buckets=(0, 2048, 4096, LENGTH),
        context_buckets=(8192, LENGTH),
    )  # fmt: skip
    NeuronModelForCausalLM.export(root / "hf", config).save_pretrained(root / "neuron")
    return NeuronModelForCausalLM.from_pretrained(root / "neuron"), hf


def test_a_32k_export_has_its_buckets_and_the_configs_rope_scaling(long_llama):
    model, hf = long_llama
    default = NeuronConfig(sequence_length=LENGTH, prefill_chunk_size=CHUNK)
    assert default.prefill_buckets == (0, 2048, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
    assert default.context_buckets == (4096, 8192, 16384, 32768)
    assert model.args.rope_scaling["rope_type"] == "llama3"
    torch.testing.assert_close(rope_inv_freq(model.args), hf.model.rotary_emb.inv_freq.float())


def test_a_32k_export_prefills_a_long_prompt_like_hf_and_its_top_bucket_runs(long_llama):
    model, hf = long_llama
    tokens = prompt(5000, seed=9)  # chunks start at 0, 2048, 4096: prior buckets 0, 2048, 4096
    torch.testing.assert_close(model.prefill(0, tokens), hf_last_logits(hf, tokens), atol=1e-3, rtol=0)
    top = model.prefill(0, prompt(700, seed=10), start=LENGTH - 800)  # prior bucket 32768
    assert model.select("chunked_prefill", 1, [LENGTH - 800], [LENGTH - 101]).bucket == LENGTH
    assert torch.isfinite(top).all()


@pytest.mark.slow
def test_smollm2_2k_prompt_in_chunks_of_512_gives_hf_eager_logits():
    """SmolLM2-135M's real weights, a 2,000-token prompt (4 chunks, the last one padded; prior buckets 0, 512, 1024,
    1536): the decoder that every graph exports gives HF eager's logits at each chunk's last token."""
    from support.smollm2 import smollm2_gguf
    from transformers import AutoModelForCausalLM

    from optimum_neuron_plugin.config import default_prefill_buckets
    from optimum_neuron_plugin.models.args import ModelArgs
    from optimum_neuron_plugin.models.decoder import decoder_logits, weight_names
    from optimum_neuron_plugin.sources import gguf_read_once

    gguf = smollm2_gguf()
    with gguf_read_once():
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    args = ModelArgs.from_hf_config(hf.config.to_dict())
    state = hf.state_dict()
    params = {name: state[name] for name in weight_names(args)}
    length, chunk, sequence_length = 2000, 512, 2048
    buckets = default_prefill_buckets(sequence_length, chunk)
    tokens = torch.randint(0, args.vocab_size, (length,), generator=torch.Generator().manual_seed(3)).tolist()
    caches, table = eager_pool(args, sequence_length, torch.float32, block_size=128, slots=1)
    with torch.no_grad():
        reference = hf(torch.tensor([tokens])).logits[0]
        for start in range(0, length, chunk):
            real = tokens[start : start + chunk]
            pad = chunk - len(real)
            ids = torch.tensor([real + real[-1:] * pad])
            positions = torch.tensor([list(range(start, start + len(real))) + [start + len(real) - 1] * pad])
            prior = next(b for b in buckets if b >= start)
            logits = decoder_logits(args, params, caches, rope_inv_freq(args), ids, positions, table, prior, chunk=True)
            expected = reference[start + len(real) - 1]
            torch.testing.assert_close(logits[0], expected, atol=2e-3, rtol=0)
            assert logits[0].argmax() == expected.argmax()
