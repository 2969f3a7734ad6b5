"""One verify step (speculative decoding): up to batch_size rows of k + 1 tokens in one verify graph call.

Row i feeds its last sampled token and its draft tokens at positions start_i, start_i + 1, ...; the graph writes
their K/V into the row's slot and returns the logits of every position, from which the host accepts drafts
(draft_acceptance.py). A row with fewer than k drafts repeats its last real token and position, and missing rows repeat
row 0: identical inputs write identical K/V to the same place (the actual-token mask, models/masks.py).

Rejected drafts need no rollback: their K/V sits at positions after the row's last accepted token, and the row's
next call writes its tokens from that position on before any query attends it (a query at position p attends
positions <= p, all written by then).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import InputError
from ..graph_inputs import RowsInputs, TokenRows
from ..graphs import VERIFY
from .graph_set import GraphSet


@dataclass
class VerifyBatch:
    seq_ids: list[int]
    token_ids: list[list[int]]  # per row: the last sampled token, then at most k drafts
    starts: list[int]  # per row: the position of its first token

    @property
    def last_positions(self) -> list[int]:
        return [start + len(tokens) - 1 for start, tokens in zip(self.starts, self.token_ids, strict=True)]


def verify(gs: GraphSet, batch: VerifyBatch) -> torch.Tensor:
    """One verify call on the graph of the fewest rows holding the batch: logits [n, k + 1, vocab] fp32 (cloned);
    row i's columns from len(token_ids[i]) on repeat its last real column."""
    nc = gs.neuron_config
    n = len(batch.seq_ids)
    width = nc.speculative_tokens + 1
    ids = [_padded(tokens, width) for tokens in batch.token_ids]
    positions = [_padded(list(range(s, s + len(t))), width) for s, t in zip(batch.starts, batch.token_ids, strict=True)]
    spec = gs.selector.select(VERIFY, n, batch.starts, batch.last_positions)
    pad = lambda values: values + values[:1] * (spec.rows - n)  # noqa: E731
    seq_ids = pad(batch.seq_ids)
    rows = TokenRows.of(pad(ids), pad(positions), gs.tables.rows(seq_ids), gs.adapters.rows(seq_ids))
    logits = gs.run(spec, RowsInputs(rows))
    return logits[:n].clone()


def _padded(values: list[int], width: int) -> list[int]:
    return values + values[-1:] * (width - len(values))


def checked_batch(
    gs: GraphSet, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], starts: Sequence[int]
) -> VerifyBatch:
    nc = gs.neuron_config
    batch = VerifyBatch(list(seq_ids), [list(t) for t in token_ids], list(starts))
    n = len(batch.seq_ids)
    if not nc.speculative_tokens:
        raise InputError(
            "this export has no verify graphs: export it again with --speculative-tokens k for speculative decoding"
        )
    if not 1 <= n <= nc.batch_size or len(batch.token_ids) != n or len(batch.starts) != n:
        raise InputError(f"verify needs 1..{nc.batch_size} rows, each with a seq_id, its tokens and a start")
    if len(set(batch.seq_ids)) != n:
        raise InputError(f"verify got duplicate seq_ids {batch.seq_ids}")
    for seq_id in batch.seq_ids:
        gs.check_seq_id(seq_id)
    if any(not 1 <= len(t) <= nc.speculative_tokens + 1 for t in batch.token_ids):
        raise InputError(
            f"verify rows take 1 to {nc.speculative_tokens + 1} tokens (the last sampled one and at most "
            f"{nc.speculative_tokens} drafts: the export's --speculative-tokens)"
        )
    if any(s < 0 for s in batch.starts) or max(batch.last_positions) >= nc.sequence_length:
        raise InputError(f"verify positions {batch.last_positions} exceed sequence_length {nc.sequence_length}")
    for seq_id, last in zip(batch.seq_ids, batch.last_positions, strict=True):
        gs.tables.reserve(seq_id, last + 1)
    return batch
