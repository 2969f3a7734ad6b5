"""Helpers for the core tests: tiny random-weight Hugging Face models, their exported artifacts, references.

Every tiny model is built offline with a fixed seed in fp32, saved with `save_pretrained`, exported once per
NeuronConfig for the whole session, written with `save_pretrained` and loaded back with `from_pretrained`: the
tests run on the loaded artifact, exactly as a user would. Exports cost seconds each, so they are shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from support.tiny_models import tiny_model

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.models.kv_cache import NULL_BLOCK, empty_cache

VOCAB = 512
SEQUENCE_LENGTH = 64
CHUNK = 8

# support.tiny_models' shape (2 layers, GQA 4/2 heads, 128 positions) with VOCAB tokens and no bos/eos/pad:
# greedy generation never stops early, in HF or here.
SEEDS = {
    "llama": 0,
    "llama3": 1,
    "mistral": 2,
    "qwen2": 3,
    "qwen3": 4,
    "gemma3": 5,
    "granite": 6,
    "phi3": 7,
    "smollm3": 8,
    "qwen3_moe": 9,
    "mixtral": 10,
    "gpt_oss": 11,
}

# The artifact shapes the tests share (each one exported once per model and session).
# prefix_copy: the copy_prefix graphs of the Python API's copy_prefix (tests/core/test_prefix_copy.py, test_fp8_kv.py).
CHUNKED = dict(batch_size=3, sequence_length=SEQUENCE_LENGTH, prefill_chunk_size=CHUNK, prefix_copy=True)
# Logits out of token_generation (sampling on the host): decode results can be compared bit for bit.
CHUNKED_LOGITS = dict(CHUNKED, on_device_sampling=False)
# Fewer graphs (2 context buckets, 3 prefill buckets: 11 graphs instead of 23) where a test is not about the bucket
# ladder. Calls still cross bucket 16, and run both a padded prior context (a chunk at 8 in prefill bucket 16) and an
# exact one (a chunk at 16).
LIGHT_BUCKETS = dict(context_buckets=(16, 64), prefill_buckets=(0, 16, 64))
CHUNKED_LIGHT = dict(CHUNKED, **LIGHT_BUCKETS)
CHUNKED_LOGITS_LIGHT = dict(CHUNKED_LOGITS, **LIGHT_BUCKETS)
# The architectures whose shared chunked export keeps the whole ladder: Llama (the bucket-edge tests) and Gemma 3 (its
# sliding window is read whole from the small buckets, by window from bucket 16 on: tests/core/test_gemma3.py).
FULL_LADDER = ("llama", "gemma3")
# The architectures whose shared chunked export samples on the host: tests/core/test_families.py compares their decode
# steps' logits, so their greedy tests run on that export too (no second set of decode graphs). The on-device sampler
# works on the final logits, whatever the family: the other architectures cover it.
HOST_SAMPLING = ("granite", "phi3", "smollm3", "qwen3_moe", "mixtral", "gpt_oss")
CONTEXT_ENCODING = dict(batch_size=3, sequence_length=SEQUENCE_LENGTH, prefill_chunk_size=0)
# One-token chunks: a first chunk, padded and exact prior contexts (prefill bucket 4 holds chunks at 1..4) and the
# whole cache (7 graphs instead of the default ladder's 19; its arithmetic: tests/core/test_buckets.py).
CHUNK_ONE = dict(
    batch_size=1, sequence_length=32, prefill_chunk_size=1, context_buckets=(8, 32), prefill_buckets=(0, 4, 32)
)


def chunked_shape(name: str) -> dict:
    """The shape of an architecture's shared chunked export: the whole bucket ladder for FULL_LADDER, the light one
    for the others; on-device sampling but for HOST_SAMPLING."""
    if name in FULL_LADDER:
        return CHUNKED
    return CHUNKED_LOGITS_LIGHT if name in HOST_SAMPLING else CHUNKED_LIGHT


@dataclass
class Tiny:
    name: str
    hf: torch.nn.Module  # the fp32 Hugging Face reference, eval mode
    path: Path  # its save_pretrained directory (the export source)


@dataclass
class Artifact:
    model: NeuronModelForCausalLM  # loaded back with from_pretrained
    path: Path  # the save_pretrained directory
    hf: torch.nn.Module
    exported: NeuronModelForCausalLM  # the model export() returned, before the round trip


class Zoo:
    """Builds each tiny model and each (model, NeuronConfig) artifact once per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._tiny: dict[str, Tiny] = {}
        self._artifacts: dict[tuple, Artifact] = {}

    def tiny(self, name: str) -> Tiny:
        if name not in self._tiny:
            hf = tiny_model(name, seed=SEEDS[name], vocab_size=VOCAB)
            path = self.root / "hf" / name
            hf.save_pretrained(path)
            self._tiny[name] = Tiny(name, hf, path)
        return self._tiny[name]

    def artifact(self, name: str, **config: object) -> Artifact:
        key = (name, tuple(sorted(config.items())))
        if key not in self._artifacts:
            tiny = self.tiny(name)
            exported = NeuronModelForCausalLM.export(tiny.path, NeuronConfig(**config))
            path = self.root / "artifacts" / f"{name}-{len(self._artifacts)}"
            exported.save_pretrained(path)
            self._artifacts[key] = Artifact(NeuronModelForCausalLM.from_pretrained(path), path, tiny.hf, exported)
        return self._artifacts[key]


def prompt(length: int, seed: int) -> list[int]:
    """A reproducible random prompt of token ids."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (length,), generator=generator).tolist()


def slot_positions(model, cache: torch.Tensor, seq_id: int) -> torch.Tensor:
    """Positions [0, sequence_length) of slot seq_id in a layer cache of `model` (or a copy of one), read through the
    slot's block table: [S, kv_heads, head_dim], a copy (entries past the slot's blocks read the null block)."""
    blocks = model.graph_set.tables.table[seq_id].long()
    return cache[blocks].flatten(0, 1)[: model.neuron_config.sequence_length]


def fill_positions(model, cache: torch.Tensor, seq_id: int, start: int, value: float) -> None:
    """Writes `value` at positions [start, S) of slot seq_id in a layer cache, in its blocks (the null block for
    positions past them)."""
    block_size = cache.shape[1]
    for position in range(start, model.neuron_config.sequence_length):
        block = int(model.graph_set.tables.table[seq_id, position // block_size])
        cache[block, position % block_size] = value


def slot_blocks(model, *seq_ids: int) -> torch.Tensor:
    """The pool blocks slots seq_ids hold now (their block tables' entries but the null block): int64, sorted."""
    table = model.graph_set.tables.table[list(seq_ids)]
    return table[table != NULL_BLOCK].unique().long()


def blocks_but(model, *seq_ids: int) -> torch.Tensor:
    """Every block of the pool but those slots seq_ids hold now (the null block and the free blocks included)."""
    held = set(slot_blocks(model, *seq_ids).tolist())
    return torch.tensor([b for b in range(model.neuron_config.num_blocks) if b not in held], dtype=torch.long)


def assert_same_cache(got, want, marker: float, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Two models of one shape hold the same K/V in every slot, each read through its own block tables, and nothing
    outside their slots' blocks (the null block, the free blocks) moved from `marker`, the value their whole caches
    were filled with."""
    slots = range(got.neuron_config.batch_size)
    for layer, (got_cache, want_cache) in enumerate(zip(got.caches, want.caches, strict=True)):
        for slot in slots:
            torch.testing.assert_close(
                slot_positions(got, got_cache, slot), slot_positions(want, want_cache, slot), atol=atol, rtol=rtol,
                msg=lambda m, layer=layer, slot=slot: f"cache {layer} slot {slot}: {m}",
            )  # fmt: skip
        for model, cache in ((got, got_cache), (want, want_cache)):
            assert (cache[blocks_but(model, *slots)] == marker).all(), f"cache {layer}: a write outside the slots"


def eager_pool(
    args, sequence_length: int, dtype: torch.dtype, block_size: int = 8, slots: int = 2
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The KV pool of an eager decoder (models.decoder.decoder_logits) for `slots` sequences of sequence_length
    positions in blocks of block_size (plus the null block), and the block table [1, W] of its last slot: that slot's
    blocks in descending order, so a position's block is read from the table, never implied by the layout."""
    width = sequence_length // block_size
    caches = empty_cache(
        args.num_hidden_layers, slots * width + 1, block_size, args.num_key_value_heads, args.head_dim, dtype
    )
    table = torch.arange(slots * width, (slots - 1) * width, -1, dtype=torch.int32)[None]
    return caches, table


class CallLog:
    """Wraps a loaded model's graphs and records (graph name, bucket, last position of row 0) per call, the
    graph's rows in `rows` and its spec in `specs`."""

    def __init__(self, model) -> None:
        self.model, self.graphs, self.calls, self.rows, self.specs = model, model.graphs, [], [], []

    def __enter__(self):
        def record(spec, *inputs):
            self.calls.append((spec.name, spec.bucket, int(inputs[1][0].max())))
            self.rows.append(spec.rows)
            self.specs.append(spec)
            return self.graphs(spec, *inputs)

        self.model.graphs = record
        return self

    def __exit__(self, *exc) -> None:
        self.model.graphs = self.graphs

    @property
    def graphs_and_buckets(self) -> list[tuple[str, int]]:
        return [(name, bucket) for name, bucket, _ in self.calls]

    @property
    def graphs_rows_and_tokens(self) -> list[tuple[str, int, int]]:
        """(graph, rows, prompt tokens) per call."""
        return [(s.name, s.rows, s.prompt_tokens) for s in self.specs]
