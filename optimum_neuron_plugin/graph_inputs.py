"""What each graph kind takes per call (everything but the weights and the KV cache): one dataclass per kind, built
with example values to trace a graph and with a call's values to run it, flattened to the graph's positional inputs
by `flat` and read back inside the graph by `unflat` (graphs.py names which kind takes which).

- RowsInputs           chunked_prefill, prompt_logits, context_encoding, verify: token rows
- DecodeInputs         token_generation: token rows [+ sampling inputs with on-device sampling]
- ChunkAndDecodeInputs chunk_and_decode: a prompt chunk, the decode rows [+ sampling inputs]
- CopyInputs           copy_prefix: the source and destination blocks

Token ids, positions and block ids are int32 (INDEX_DTYPE): the graph widens them only where an op needs int64.
In exports with LoRA slots every TokenRows also carries each row's adapter slot [n] int32 (models/lora.py).
Every row carries its whole block table (spec.blocks entries, sequence_length / block_size, the unused ones the null
block 0): one input shape for every bucket, of which a graph reads the entries its bucket covers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from .graph_spec import GraphSpec

# dtype of the token id, position and seq id inputs of every graph (int64 is emulated on NeuronCores).
INDEX_DTYPE = torch.int32


class TokenRows(NamedTuple):
    """n rows of T tokens: their ids [n, T], positions [n, T] and each row's block table [n, blocks]
    (models.decoder.Rows, models/kv_cache.py); in exports with LoRA slots, each row's adapter slot [n] (0: the
    base model, models/lora.py)."""

    ids: torch.Tensor
    positions: torch.Tensor
    block_tables: torch.Tensor
    adapters: torch.Tensor | None = None

    @classmethod
    def example(cls, rows: int, tokens: int, blocks: int, lora: bool = False) -> TokenRows:
        """Rows at positions 0.. in blocks 1, 2, ... (each row the same: example values only shape a graph)."""
        positions = torch.arange(tokens, dtype=INDEX_DTYPE).repeat(rows, 1)
        tables = torch.arange(1, blocks + 1, dtype=INDEX_DTYPE).repeat(rows, 1)
        adapters = torch.zeros(rows, dtype=INDEX_DTYPE) if lora else None
        return cls(torch.zeros(rows, tokens, dtype=INDEX_DTYPE), positions, tables, adapters)

    @classmethod
    def of(
        cls,
        ids: Sequence[Sequence[int]],
        positions: Sequence[Sequence[int]],
        tables: torch.Tensor,
        adapters: torch.Tensor | None = None,
    ) -> TokenRows:
        as_input = lambda values: torch.tensor(values, dtype=INDEX_DTYPE)  # noqa: E731
        return cls(as_input(ids), as_input(positions), tables, adapters)

    @classmethod
    def stacked(cls, groups: Sequence[TokenRows]) -> TokenRows:
        """The rows of every group, in group order (a batched prefill's chunks)."""
        columns = zip(*groups, strict=True)
        return cls(*(None if column[0] is None else torch.cat(column) for column in columns))


@dataclass(frozen=True)
class SamplingInputs:
    """On-device sampling, per row: top_k, top_p, temperature and min_p [n, 4] fp32, a uniform draw [n, 1] fp32, the
    packed allowed-token bitmask [n, words] int32 (spec.bitmask_words > 0) and spec.logit_bias (token id, bias)
    pairs as ids [n, M] int32 and biases [n, M] fp32 (spec.logit_bias > 0)."""

    params: torch.Tensor
    uniform: torch.Tensor
    bitmask: torch.Tensor | None = None
    bias_ids: torch.Tensor | None = None
    bias_values: torch.Tensor | None = None

    @property
    def logit_bias(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self.bias_ids is None else (self.bias_ids, self.bias_values)

    @classmethod
    def example(cls, spec: GraphSpec) -> SamplingInputs:
        params = torch.tensor([[1.0, 1.0, 1.0, 0.0]]).repeat(spec.rows, 1)
        bitmask = all_allowed(spec.rows, spec.bitmask_words) if spec.bitmask_words else None
        bias = no_logit_bias(spec.rows, spec.logit_bias) if spec.logit_bias else (None, None)
        return cls(params, torch.zeros(spec.rows, 1), bitmask, *bias)

    @classmethod
    def unflat(cls, spec: GraphSpec, tensors: Iterator[torch.Tensor]) -> SamplingInputs:
        params, uniform = next(tensors), next(tensors)
        bitmask = next(tensors) if spec.bitmask_words else None
        bias = (next(tensors), next(tensors)) if spec.logit_bias else (None, None)
        return cls(params, uniform, bitmask, *bias)


@dataclass(frozen=True)
class RowsInputs:
    rows: TokenRows

    @classmethod
    def example(cls, spec: GraphSpec) -> RowsInputs:
        return cls(TokenRows.example(spec.rows, spec.tokens, spec.blocks, spec.lora))

    @classmethod
    def unflat(cls, spec: GraphSpec, tensors: Iterator[torch.Tensor]) -> RowsInputs:
        return cls(_rows(spec, tensors))


@dataclass(frozen=True)
class DecodeInputs:
    rows: TokenRows
    sampling: SamplingInputs | None = None  # None: the graph returns logits (host sampling)

    @classmethod
    def example(cls, spec: GraphSpec) -> DecodeInputs:
        return cls(
            TokenRows.example(spec.rows, spec.tokens, spec.blocks, spec.lora),
            SamplingInputs.example(spec) if spec.samples else None,
        )

    @classmethod
    def unflat(cls, spec: GraphSpec, tensors: Iterator[torch.Tensor]) -> DecodeInputs:
        rows = _rows(spec, tensors)
        return cls(rows, SamplingInputs.unflat(spec, tensors) if spec.samples else None)


@dataclass(frozen=True)
class ChunkAndDecodeInputs:
    chunk: TokenRows  # one row of spec.chunk tokens
    rows: TokenRows  # the decode rows
    sampling: SamplingInputs | None = None

    @classmethod
    def example(cls, spec: GraphSpec) -> ChunkAndDecodeInputs:
        decode = DecodeInputs.example(spec)
        return cls(TokenRows.example(1, spec.chunk, spec.blocks, spec.lora), decode.rows, decode.sampling)

    @classmethod
    def unflat(cls, spec: GraphSpec, tensors: Iterator[torch.Tensor]) -> ChunkAndDecodeInputs:
        chunk = _rows(spec, tensors)
        decode = DecodeInputs.unflat(spec, tensors)
        return cls(chunk, decode.rows, decode.sampling)


@dataclass(frozen=True)
class CopyInputs:
    source: torch.Tensor  # [blocks] int32: the block table copied from
    destination: torch.Tensor  # [blocks] int32: the block table copied onto

    @classmethod
    def example(cls, spec: GraphSpec) -> CopyInputs:
        blocks = torch.arange(1, spec.blocks + 1, dtype=INDEX_DTYPE)
        return cls(blocks, blocks.clone())  # blocks onto themselves (two inputs: tracing must not see one aliased)

    @classmethod
    def unflat(cls, spec: GraphSpec, tensors: Iterator[torch.Tensor]) -> CopyInputs:
        return cls(next(tensors), next(tensors))


GraphInputs = RowsInputs | DecodeInputs | ChunkAndDecodeInputs | CopyInputs


def flat(inputs: GraphInputs | SamplingInputs | TokenRows) -> tuple[torch.Tensor, ...]:
    """The graph's positional inputs: the fields in declaration order, nested ones expanded, absent (None) ones left
    out. The `unflat` classmethods read them back in the same order."""
    values = inputs if isinstance(inputs, tuple) else [getattr(inputs, f.name) for f in fields(inputs)]
    tensors: list[torch.Tensor] = []
    for value in values:
        if value is not None:
            tensors.extend(flat(value) if isinstance(value, tuple) or is_dataclass(value) else (value,))
    return tuple(tensors)


def all_allowed(rows: int, words: int) -> torch.Tensor:
    """A packed token bitmask [rows, words] that allows every token (all bits set)."""
    return torch.full((rows, words), -1, dtype=torch.int32)


def no_logit_bias(rows: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logit_bias inputs ([rows, slots] int32 ids, fp32 biases) that change nothing: token 0, bias 0."""
    return torch.zeros(rows, slots, dtype=INDEX_DTYPE), torch.zeros(rows, slots)


def _rows(spec: GraphSpec, tensors: Iterator[torch.Tensor]) -> TokenRows:
    return TokenRows(next(tensors), next(tensors), next(tensors), next(tensors) if spec.lora else None)
