"""min_tokens, allowed_token_ids and bad_words as rows of the packed token bitmask the on-device sampling graphs take.

vLLM applies them as logits processors (v1/sample/sampler.py apply_logits_processors): allowed_token_ids keeps only
its ids, bad_words bans each bad word's last token when the tokens generated so far end with the rest of it
(v1/sample/ops/bad_words.py), and min_tokens bans the stop tokens (stop_token_ids and EOS unless ignore_eos) while
fewer tokens than min_tokens were generated, unless that would leave nothing allowed (MinTokensLogitsProcessor).
Here the same rules clear bits of the request's bitmask row, ANDed with its grammar row, so the decode graph masks
them before top-k / top-p. Host logits (every first token) go through vLLM's own processors (host_sampling.py).
"""

from __future__ import annotations

import numpy as np
import torch

from ..runner.request_state import RequestState


def constrained_bitmask(grammar: torch.Tensor | None, states: list[RequestState], words: int) -> torch.Tensor | None:
    """The decode batch's packed bitmask [n, words]: each request's grammar row (all ones without a grammar) AND its
    token constraints; `grammar` itself when no request of the batch has constraints."""
    constrained = [i for i, state in enumerate(states) if state.has_token_constraints()]
    if not constrained:
        return grammar
    rows = torch.full((len(states), words), -1, dtype=torch.int32) if grammar is None else grammar.clone()
    for i in constrained:
        rows[i] = pack(constrained_row(unpack(rows[i]), states[i]))
    return rows


def constrained_row(allowed: np.ndarray, state: RequestState) -> np.ndarray:
    """allowed [words * 32] bool, with the request's constraints applied (vLLM's order)."""
    params, vocab = state.params, allowed.shape[0]
    if params.allowed_token_ids:
        keep = np.zeros_like(allowed)
        keep[[t for t in params.allowed_token_ids if t < vocab]] = True
        allowed &= keep
    for token in banned_bad_words(params.bad_words_token_ids or [], state.output_token_ids):
        if token < vocab:
            allowed[token] = False
    if len(state.output_token_ids) < params.min_tokens:
        without_stops = allowed.copy()
        without_stops[[t for t in params.all_stop_token_ids if t < vocab]] = False
        if without_stops.any():
            allowed = without_stops
    return allowed


def banned_bad_words(bad_words: list[list[int]], generated: list[int]) -> list[int]:
    """The last token of every bad word whose other tokens end the generated tokens."""
    banned = []
    for word in bad_words:
        prefix = word[:-1]
        if len(prefix) <= len(generated) and generated[len(generated) - len(prefix) :] == prefix:
            banned.append(word[-1])
    return banned


def unpack(row: torch.Tensor) -> np.ndarray:
    """A packed int32 row [words] -> bool [words * 32]: bit j of word i is token 32 * i + j (little-endian words)."""
    return np.unpackbits(row.numpy().astype("<i4").view(np.uint8), bitorder="little").astype(bool)


def pack(allowed: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32))
