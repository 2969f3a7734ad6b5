"""The fused step: a prompt's chunk and the decode batch in one chunk_and_decode call, one pass over the weights.

The batch rides in the first chunk whose context bucket (the smallest holding the chunk's last position) also holds
every decode row, so the chunk never attends more cache than that bucket; the chunk loop goes on for the rest of the
prompt.
"""

from __future__ import annotations

import torch

from ..errors import InputError
from ..graph_inputs import ChunkAndDecodeInputs
from ..graphs import CHUNK_AND_DECODE
from .chunk_loop import chunk_inputs, prefill_batch
from .decode import DecodeBatch, DecodeResult, decode, decode_inputs, decoded
from .graph_select import chunk_tokens
from .graph_set import GraphSet


def prefill_and_decode(
    gs: GraphSet, seq_id: int, tokens: list[int], start: int, batch: DecodeBatch
) -> tuple[torch.Tensor, DecodeResult]:
    """Same results as the prefill and the decode apart; the two calls when no chunk's bucket holds the batch (or
    the artifact has no chunk_and_decode graph)."""
    if seq_id in batch.seq_ids:
        raise InputError(f"slot {seq_id} cannot prefill and decode in the same call")
    fused_at = gs.selector.riding_chunk(len(tokens), start, batch.positions)
    # A call that raises leaves the generators as they were (also when the decode ran before a prefill that raised):
    # the caller may run the two calls apart instead, and a seeded request then draws what it would have drawn.
    saved = [None if g is None else g.get_state() for g in batch.generators]
    try:
        if fused_at is None:
            result = decode(gs, batch)
            return prefill(gs, seq_id, tokens, start), result
        return fused(gs, seq_id, tokens, start, fused_at, batch)
    except Exception:
        for generator, state in zip(batch.generators, saved, strict=True):
            if generator is not None:
                generator.set_state(state)
        raise


def fused(
    gs: GraphSet, seq_id: int, tokens: list[int], start: int, fused_at: int, batch: DecodeBatch
) -> tuple[torch.Tensor, DecodeResult]:
    nc = gs.neuron_config
    if fused_at:
        prefill(gs, seq_id, tokens[:fused_at], start)
        gs.tables.reserve(seq_id, start + len(tokens))  # that prefill reserved its own positions only
    size = chunk_tokens(nc, len(tokens) - fused_at)  # the tail graph when the rest of the prompt fits in it
    chunk, positions = chunk_inputs(gs, seq_id, tokens, start, fused_at, size)
    tail = size != nc.prefill_length
    spec = gs.selector.select(CHUNK_AND_DECODE, len(batch.seq_ids), positions[:1], batch.positions, tail)
    decoding = decode_inputs(gs, batch, nc.batch_size)
    output = gs.run(spec, ChunkAndDecodeInputs(chunk, decoding.rows, decoding.sampling))
    if nc.on_device_sampling:
        chunk_logits, *sampled = output
        tokens_out = tuple(sampled) if len(sampled) > 1 else sampled[0]
    else:
        chunk_logits, tokens_out = output[:1], output[1:]
    result = decoded(gs, tokens_out, batch)
    after = fused_at + nc.prefill_length
    if after < len(tokens):
        return prefill(gs, seq_id, tokens[after:], start + after), result
    return chunk_logits[0].clone(), result


def prefill(gs: GraphSet, seq_id: int, tokens: list[int], start: int) -> torch.Tensor:
    return prefill_batch(gs, [(seq_id, tokens, start)])[0]
