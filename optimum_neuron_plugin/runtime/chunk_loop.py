"""The per-sequence chunk loop: a prompt's tokens go through the prefill graph one compiled chunk at a time, each
call scattering the chunk's K/V into the prompt's cache slot.

A partial last chunk is padded by repeating its last token and position (the actual-token mask, models/masks.py).
With tail graphs (prefill_tail_size T), a last piece of at most T tokens runs alone on the T-token graph: a call
costs about its tokens, so the question after a prefix-cache hit does not pay for a whole chunk. With prefill
batch graphs (prefill_batch_size P), up to P whole chunks share a call, of several prompts or of one: one pass over
the weights and, on Neuron, one launch for P chunks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import InputError
from ..graph_inputs import RowsInputs, TokenRows
from ..graphs import PROMPT_LOGITS
from .graph_select import chunk_tokens
from .graph_set import GraphSet

Prompt = tuple[int, Sequence[int], int]  # (seq_id, token_ids, start)
ChunkInputs = tuple[TokenRows, list[int]]  # the chunk's row, its positions


def prefill_batch(gs: GraphSet, prompts: Sequence[Prompt]) -> list[torch.Tensor]:
    """Runs the chunk loops of prompts in distinct slots side by side: their whole chunks in order of offset, up to
    prefill_batch_size of them per call (the graph of exactly that many rows), a prompt's successive chunks too: a call
    writes every row's K/V before any row attends, so a chunk sees the chunks before it in its own call. A last piece
    that fits the tail graph runs alone on it, after the prompt's whole chunks. Returns each prompt's fp32 logits
    [vocab] of its last token."""
    checked = [(seq_id, checked_prompt(gs, seq_id, tokens, start), start) for seq_id, tokens, start in prompts]
    slots = [seq_id for seq_id, _, _ in checked]
    if not checked or len(set(slots)) != len(slots):
        raise InputError(f"prefill_batch needs prompts in distinct slots, got seq_ids {slots}")
    nc = gs.neuron_config
    size, width = nc.prefill_length, nc.prefill_batch_size
    pieces = sorted((offset, i) for i, (_, tokens, _) in enumerate(checked) for offset in range(0, len(tokens), size))
    tails = [(offset, i) for offset, i in pieces if chunk_tokens(nc, len(checked[i][1]) - offset) < size]
    whole = [piece for piece in pieces if piece not in tails]
    logits: list[torch.Tensor | None] = [None] * len(checked)
    for group in (whole[g : g + width] for g in range(0, len(whole), width)):
        output = chunks_call(gs, [chunk_inputs(gs, *checked[i], offset) for offset, i in group])
        for row, (offset, i) in enumerate(group):
            if offset + size >= len(checked[i][1]):
                logits[i] = output[row].clone()  # the runtime may reuse the output buffer
    for offset, i in tails:  # a tail call costs about its tokens, less than a row of a batched chunk
        tail = nc.prefill_tail_size
        logits[i] = chunks_call(gs, [chunk_inputs(gs, *checked[i], offset, tail)], tail=True)[0].clone()
    return logits


def prefill_positions(gs: GraphSet, seq_id: int, token_ids: Sequence[int], start: int) -> torch.Tensor:
    """The chunk loop of one prompt on the prompt_logits graphs: returns the fp32 logits [n, vocab] of every token
    (the padding rows of a partial last chunk dropped)."""
    if not gs.neuron_config.prompt_logprobs:
        raise InputError("this export has no prompt_logits graphs: export it again with --prompt-logprobs")
    tokens = checked_prompt(gs, seq_id, token_ids, start)
    rows = []
    for offset in range(0, len(tokens), gs.neuron_config.prefill_length):
        inputs, positions = chunk_inputs(gs, seq_id, tokens, start, offset)
        spec = gs.selector.select(PROMPT_LOGITS, 1, positions[:1], positions[-1:])
        rows.append(
            gs.run(spec, RowsInputs(inputs))[: len(positions)].clone()
        )  # the runtime may reuse the output buffer
    return torch.cat(rows)


def chunks_call(gs: GraphSet, chunks: list[ChunkInputs], tail: bool = False) -> torch.Tensor:
    """One prefill call for n chunks: the one-prompt graph for one, else the n-prompt graph (one per width: a padding
    row would cost as much as a real one); tail: one chunk on the tail graph. Chunks of one slot come in order."""
    starts, lasts = [p[0] for _, p in chunks], [p[-1] for _, p in chunks]
    spec = gs.selector.select(gs.neuron_config.prefill_graph, len(chunks), starts, lasts, tail)
    rows = chunks[0][0] if len(chunks) == 1 else TokenRows.stacked([inputs for inputs, _ in chunks])
    return gs.run(spec, RowsInputs(rows))


def chunk_inputs(
    gs: GraphSet, seq_id: int, tokens: list[int], start: int, offset: int, size: int | None = None
) -> ChunkInputs:
    """The inputs of the chunk of `size` tokens (default: prefill_length) at `offset` (positions from start +
    offset), and its positions."""
    size = size or gs.neuron_config.prefill_length
    chunk = tokens[offset : offset + size]
    positions = list(range(start + offset, start + offset + len(chunk)))
    pad = size - len(chunk)
    rows = TokenRows.of(
        [chunk + chunk[-1:] * pad], [positions + positions[-1:] * pad], gs.tables.rows([seq_id]),
        gs.adapters.rows([seq_id]),
    )  # fmt: skip
    return rows, positions


def checked_prompt(gs: GraphSet, seq_id: int, token_ids: Sequence[int], start: int) -> list[int]:
    nc = gs.neuron_config
    tokens = [int(t) for t in token_ids]
    gs.check_seq_id(seq_id)
    if not tokens:
        raise InputError("prefill needs at least one token")
    if start < 0 or start + len(tokens) > nc.sequence_length:
        raise InputError(
            f"positions {start}..{start + len(tokens) - 1} do not fit sequence_length {nc.sequence_length}: "
            "shorten the prompt or export with a larger --sequence-length"
        )
    gs.tables.reserve(seq_id, start + len(tokens), restart=start == 0)
    return tokens
