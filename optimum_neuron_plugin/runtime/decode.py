"""One decode step: a token_generation call for up to batch_size sequences, sampled on the device or on the host.

Missing rows are padded by repeating row 0: identical inputs write identical K/V to the same place.
With on-device sampling every call passes a packed token bitmask (structured outputs): the batch's, or all ones;
and each row's logit_bias pairs (SamplingParams.logit_bias), padded with (0, 0.0).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import InputError
from ..graph_inputs import DecodeInputs, SamplingInputs, TokenRows, all_allowed, no_logit_bias
from ..graphs import TOKEN_GENERATION
from ..sampling import GREEDY, SamplingParams, draw_uniform, params_tensor, sample_on_host
from .graph_select import graph_rows
from .graph_set import GraphSet
from .ranks import from_rank0


@dataclass
class SampledLogprobs:
    """Raw logprobs (log-softmax of the model's logits) of tokens sampled on the device, in vLLM's LogprobsTensors
    layout, one row per sequence."""

    token_ids: torch.Tensor  # [n, 1 + max_logprobs] int32: the sampled token, then the most likely max_logprobs
    logprobs: torch.Tensor  # [n, 1 + max_logprobs] fp32
    ranks: torch.Tensor  # [n] int32: tokens at least as likely as the sampled one (1: the most likely)


@dataclass
class DecodeResult:
    tokens: list[int]
    logits: torch.Tensor | None  # [n, vocab] fp32, cloned; only when sampled on the host
    logprobs: SampledLogprobs | None = None  # sampled on the device by graphs that return logprobs (max_logprobs > 0)


@dataclass
class DecodeBatch:
    """A checked decode batch: one entry per sequence (sampling and generators defaulted to greedy, none)."""

    seq_ids: list[int]
    token_ids: list[int]
    positions: list[int]
    sampling: list[SamplingParams]
    generators: list[torch.Generator | None]
    # Packed allowed-token bitmask [n, ceil(vocab / 32)] int32 (bit j of word i allows token 32 * i + j), a row of
    # all ones (-1) for a sequence without a grammar; None: every token allowed. On-device sampling only.
    bitmask: torch.Tensor | None = None


def decode(gs: GraphSet, batch: DecodeBatch, rows: int | None = None) -> DecodeResult:
    """One token_generation call on the graph of `rows` rows, by default the fewest (of decode_batch_sizes) that
    hold the batch."""
    nc = gs.neuron_config
    fewest = graph_rows(nc, TOKEN_GENERATION, len(batch.seq_ids))
    if rows is None:
        rows = fewest
    elif rows < fewest or rows not in nc.decode_batch_sizes:
        raise InputError(
            f"decode of {len(batch.seq_ids)} sequences cannot run on {rows} rows: this export has token_generation "
            f"graphs of {', '.join(map(str, nc.decode_batch_sizes))} rows"
        )
    spec = gs.selector.select(TOKEN_GENERATION, rows, (), batch.positions)
    return decoded(gs, gs.run(spec, decode_inputs(gs, batch, rows)), batch)


def decode_inputs(gs: GraphSet, batch: DecodeBatch, rows: int) -> DecodeInputs:
    """The decode batch's inputs padded to the graph's rows, with its sampling inputs (on-device sampling)."""
    pad = rows - len(batch.seq_ids)
    padded = lambda values: list(values) + [values[0]] * pad  # noqa: E731
    seq_ids = padded(batch.seq_ids)
    tables, adapters = gs.tables.rows(seq_ids), gs.adapters.rows(seq_ids)
    inputs = TokenRows.of(
        [[t] for t in padded(batch.token_ids)], [[p] for p in padded(batch.positions)], tables, adapters
    )
    if not gs.neuron_config.on_device_sampling:
        return DecodeInputs(inputs)
    return DecodeInputs(inputs, sampling_inputs(gs, batch, rows))


def sampling_inputs(gs: GraphSet, batch: DecodeBatch, rows: int) -> SamplingInputs:
    pad = rows - len(batch.seq_ids)
    params = params_tensor(batch.sampling + [batch.sampling[0]] * pad, gs.neuron_config.max_topk)
    uniform = from_rank0(gs.group, torch.cat((draw_uniform(batch.generators), torch.zeros(pad, 1))))
    bitmask = bitmask_input(gs, batch.bitmask, rows) if gs.bitmask_words else None
    bias = logit_bias_inputs(batch.sampling, rows, gs.logit_bias_slots) if gs.logit_bias_slots else (None, None)
    return SamplingInputs(params, uniform, bitmask, *bias)


def logit_bias_inputs(sampling: list[SamplingParams], rows: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The graph's logit_bias inputs: ids [rows, slots] int32 and biases [rows, slots] fp32, each row's pairs first,
    then (0, 0.0). Batches without a bias share one zero pair per row count (the graphs only read their inputs)."""
    if not any(p.logit_bias for p in sampling):
        return _no_logit_bias(rows, slots)
    ids, values = (x.clone() for x in _no_logit_bias(rows, slots))
    for row, params in enumerate(sampling):
        for slot, (token, bias) in enumerate(params.logit_bias):
            ids[row, slot], values[row, slot] = token, bias
    return ids, values


@functools.cache
def _no_logit_bias(rows: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    return no_logit_bias(rows, slots)


def bitmask_input(gs: GraphSet, bitmask: torch.Tensor | None, rows: int) -> torch.Tensor:
    """The graph's token bitmask [rows, words]: the batch's rows, padding rows allowing everything. Unstructured
    batches share one all-ones tensor per row count (the graphs only read their inputs)."""
    words = gs.bitmask_words
    if bitmask is None:
        return _all_allowed(rows, words)
    return torch.cat((bitmask, _all_allowed(rows - bitmask.shape[0], words)))


@functools.cache
def _all_allowed(rows: int, words: int) -> torch.Tensor:
    return all_allowed(rows, words)


def decoded(gs: GraphSet, output: torch.Tensor | tuple[torch.Tensor, ...], batch: DecodeBatch) -> DecodeResult:
    """The graph's token ids (on-device sampling; with their logprobs when it returns them), or its logits sampled
    on the host."""
    n = len(batch.seq_ids)
    if isinstance(output, tuple):
        token_ids, logprobs, ranks = (x[:n] for x in output)
        return DecodeResult(token_ids[:, 0].tolist(), None, SampledLogprobs(token_ids, logprobs, ranks))
    if gs.neuron_config.on_device_sampling:
        return DecodeResult(output[:n].tolist(), None)
    logits = output[:n].clone()
    tokens = from_rank0(gs.group, sample_on_host(logits, batch.sampling, batch.generators))
    return DecodeResult(tokens.tolist(), logits)


def checked_batch(
    gs: GraphSet,
    seq_ids: Sequence[int],
    token_ids: Sequence[int],
    positions: Sequence[int],
    sampling: Sequence[SamplingParams] | None,
    generators: Sequence[torch.Generator | None] | None,
    bitmask: torch.Tensor | None = None,
) -> DecodeBatch:
    nc = gs.neuron_config
    n = len(seq_ids)
    batch = DecodeBatch(
        list(seq_ids),
        list(token_ids),
        list(positions),
        list(sampling or [GREEDY] * n),
        list(generators or [None] * n),
        bitmask,
    )
    if not 1 <= n <= nc.batch_size:
        raise InputError(f"decode got {n} sequences; the model was compiled for batch_size {nc.batch_size}")
    if not len(batch.token_ids) == len(batch.positions) == len(batch.sampling) == len(batch.generators) == n:
        raise InputError("decode needs one token, position, sampling params and generator per sequence")
    if len(set(batch.seq_ids)) != n:
        raise InputError(f"decode got duplicate seq_ids {batch.seq_ids}")
    for seq_id in batch.seq_ids:
        gs.check_seq_id(seq_id)
    if any(not 0 <= p < nc.sequence_length for p in batch.positions):
        raise InputError(f"decode positions {batch.positions} exceed sequence_length {nc.sequence_length}")
    if bitmask is not None:
        check_bitmask(gs, bitmask, n)
    check_logit_bias(gs, batch.sampling)
    for seq_id, position in zip(batch.seq_ids, batch.positions, strict=True):
        gs.tables.reserve(seq_id, position + 1)
    return batch


def check_logit_bias(gs: GraphSet, sampling: list[SamplingParams]) -> None:
    """On device a row carries at most the compiled logit_bias pairs, each a token of the vocabulary."""
    slots, vocab = gs.logit_bias_slots, gs.vocab_size
    for params in sampling:
        if not params.logit_bias or not gs.neuron_config.on_device_sampling:
            continue
        if len(params.logit_bias) > slots:
            raise InputError(
                f"logit_bias has {len(params.logit_bias)} entries but this export's decode graphs take at most "
                f"{slots} per sequence (max_logit_bias): pass fewer or export again with a larger max_logit_bias"
            )
        bad = [token for token, _ in params.logit_bias if not 0 <= token < vocab]
        if bad:
            raise InputError(f"logit_bias token ids {bad} are outside the vocabulary [0, {vocab})")


def check_bitmask(gs: GraphSet, bitmask: torch.Tensor, n: int) -> None:
    if not gs.bitmask_words:
        on_device = gs.neuron_config.on_device_sampling
        where = "has no bitmask input" if on_device else "samples on the host: mask the logits there"
        raise InputError(f"a token bitmask needs on-device sampling graphs that take one; this export {where}")
    words = gs.bitmask_words
    if bitmask.dtype != torch.int32 or tuple(bitmask.shape) != (n, words):
        raise InputError(
            f"the token bitmask must be int32 [{n}, {words}] (one row per sequence, ceil(vocab / 32) words); "
            f"got {bitmask.dtype} {list(bitmask.shape)}"
        )
