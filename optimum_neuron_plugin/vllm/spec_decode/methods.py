"""Speculative decoding through vLLM's `--speculative-config`: n-gram (prompt lookup) drafts from vLLM's own
NgramProposer, or greedy drafts of a second export (draft_model.py), verified by the artifact's verify graph
(runtime/verify.py), accepted on the host (draft_acceptance.py).

vLLM 0.32's protocol (v1/core/sched/scheduler.py, v1/engine/core.py): after each step the engine asks the worker
for drafts (take_draft_token_ids) and stores them on the requests (spec_token_ids); the next schedule() gives a
decoding request 1 + len(drafts) tokens and names the drafts in scheduled_spec_decode_tokens; the runner returns
the accepted drafts plus one token in sampled_token_ids, and update_from_output rolls num_computed_tokens back by the
rejected drafts and records vLLM's spec-decode metrics. Requests whose tokens need host logits processing, logprobs
or a grammar get no drafts (they decode one token per step as without speculation).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from vllm.config import VllmConfig

from ...config import NeuronConfig
from ..compat import ngram_proposer, propose_ngrams
from ..engine.options import PREFILL_MODE_ENV, PrefillMode
from .draft_gate import min_acceptance
from .draft_model import DRAFT_MODEL, DraftModelDrafts, draft_problems

NGRAM = "ngram"
METHODS = (NGRAM, DRAFT_MODEL)


def speculation_problems(vllm_config: VllmConfig, neuron_config: NeuronConfig, mode: PrefillMode) -> list[str]:
    """What --speculative-config asks that this artifact and configuration cannot serve, with what to change."""
    spec = vllm_config.speculative_config
    if spec is None:
        return []
    k, compiled = spec.num_speculative_tokens, neuron_config.speculative_tokens
    if spec.method not in METHODS:
        return [
            f"speculative decoding method {spec.method!r} is not supported by the Neuron plugin: use "
            f'--speculative-config \'{{"method": "ngram", "num_speculative_tokens": {compiled or k}}}\' (prompt lookup) '
            f'or \'{{"method": "draft_model", "model": "<draft export dir>", "num_speculative_tokens": {compiled or k}}}\''
        ]
    problems = []
    if spec.method == DRAFT_MODEL:
        model_config = vllm_config.model_config
        max_model_len = min(model_config.max_model_len, neuron_config.sequence_length)
        problems += draft_problems(
            spec.model, neuron_config, model_config.model, model_config.get_vocab_size(), max_model_len
        )
    if not compiled:
        problems.append(
            f"--speculative-config needs verify graphs: export the model again with --speculative-tokens {k}"
        )
    elif k != compiled:
        problems.append(
            f"num_speculative_tokens={k} does not match the artifact's verify graphs ({compiled} draft tokens): set "
            f'"num_speculative_tokens": {compiled}, or export again with --speculative-tokens {k}'
        )
    if mode is PrefillMode.INTERLEAVED:
        problems.append(
            f"speculative decoding is not supported with {PREFILL_MODE_ENV}=interleaved: use the serial prefill mode "
            "or remove --speculative-config"
        )
    if neuron_config.tp_degree > 1:
        problems.append(
            "speculative decoding is not supported with tensor parallelism: remove --speculative-config, or export "
            "without --tensor-parallel-size"
        )
    try:
        min_acceptance()
    except ValueError as error:
        problems.append(str(error))
    return problems


def make_drafter(vllm_config: VllmConfig, slots: int) -> NgramDrafts | DraftModelDrafts | None:
    """The proposer --speculative-config asks for (speculation_problems refused the others); slots: the compiled
    batch size."""
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    if spec.method == DRAFT_MODEL:
        return DraftModelDrafts(spec.model, spec.num_speculative_tokens, vllm_config.model_config.max_model_len)
    return NgramDrafts(vllm_config, slots)


def num_speculative_tokens(vllm_config: VllmConfig) -> int:
    spec = vllm_config.speculative_config
    return 0 if spec is None else spec.num_speculative_tokens


class NgramDrafts:
    """vLLM's NgramProposer over a token table kept per slot: row s holds the tokens of the request in slot s, appended
    to with the tokens it gained since its last proposal (vLLM's own runner keeps such a table, InputBatch)."""

    def __init__(self, vllm_config: VllmConfig, slots: int) -> None:
        import numba

        # The lookup is a numba parallel loop (one thread below 8192 tokens). Numba's default OpenMP pool and the
        # graphs' OpenMP pool (torch's) then contend for the cores: every graph call ran ~40x slower (SmolLM2 on
        # the cpu backend, benchmark/results/20261126-speculative-ngram-k4-vs-plain). Numba's own workqueue pool
        # does not. The layer is fixed at numba's first parallel call; an explicit NUMBA_THREADING_LAYER wins.
        if "NUMBA_THREADING_LAYER" not in os.environ:
            numba.config.THREADING_LAYER = "workqueue"
        self.proposer = ngram_proposer(vllm_config, slots)
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.table = np.zeros((slots, vllm_config.model_config.max_model_len), dtype=np.int32)
        self.held = [0] * slots  # tokens of row s that are its source's
        self.sources: list[list[int] | None] = [None] * slots  # the token list row s follows
        # vLLM's own warm-up proposes for no request, so numba would compile the lookup on the first real proposal
        # (seconds, inside a request's step): compile it here, at startup.
        self.propose([0], [[1, 2, 1, 2]])
        self.sources[0] = None

    def warm_up(self) -> None:
        pass

    def propose(self, slots: Sequence[int], token_lists: Sequence[list[int]]) -> list[list[int]]:
        """Each request's drafts (at most k, none where no n-gram of its suffix recurs) given its slot and all its
        tokens: a list extended in place from step to step (RequestState.all_token_ids), so only its new tokens are
        written; another list (a new request in the slot, a resumed one) is written whole."""
        if not token_lists:
            return []
        lengths = np.zeros(len(self.table), dtype=np.int32)
        for slot, tokens in zip(slots, token_lists, strict=True):
            self._follow(slot, tokens)
            lengths[slot] = len(tokens)
        return propose_ngrams(self.proposer, self.k, self.table, lengths, slots)

    def _follow(self, slot: int, tokens: list[int]) -> None:
        """Row `slot` of the table holds `tokens`."""
        held = self.held[slot] if self.sources[slot] is tokens and self.held[slot] <= len(tokens) else 0
        self.table[slot, held : len(tokens)] = tokens[held:]
        self.held[slot], self.sources[slot] = len(tokens), tokens
