"""A step's structured-output bitmask (vLLM's GrammarOutput), by request, for the host sampler and the graphs.

vLLM 0.32 (v1/engine/core.py step) calls execute_model, then computes the grammar bitmask of the scheduled requests
that sample this step (scheduler.get_grammar_bitmask: xgrammar's packed int32 rows, bit j of word i allowing token
32 * i + j, one row per id of structured_output_request_ids), then calls sample_tokens(grammar_output). The worker
runs a step holding such requests in sample_tokens (worker.py), so the bitmask exists before any graph call samples.
Structured requests get no speculative drafts (spec_decode/methods.py), so every structured request has exactly one row.
"""

from __future__ import annotations

import torch
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

from ..compat import apply_grammar_bitmask_to_rows


class StepGrammar:
    def __init__(self, scheduler_output: SchedulerOutput, grammar_output: GrammarOutput | None) -> None:
        self.scheduler_output = scheduler_output
        self.output = grammar_output
        ids = grammar_output.structured_output_request_ids if grammar_output is not None else []
        self.rows = {req_id: i for i, req_id in enumerate(ids)}

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.rows

    def mask_host_logits(self, logits: torch.Tensor, req_ids: list[str]) -> None:
        """vLLM's own application (apply_grammar_bitmask, xgrammar's kernel): disallowed tokens of the structured
        rows of logits [n, V] (row i belongs to req_ids[i]) become -inf, in place, as in vLLM's runner before its
        sampler (so raw logprobs see the mask too)."""
        if any(req_id in self.rows for req_id in req_ids):
            apply_grammar_bitmask_to_rows(self.scheduler_output, self.output, req_ids, logits)

    def bitmask(self, req_ids: list[str], words: int) -> torch.Tensor | None:
        """The packed bitmask [n, words] of a decode batch (all ones for a request without a grammar), or None when
        no request of the batch has one. Words past vLLM's rows (a tokenizer smaller than the model's vocabulary)
        allow nothing: the grammar cannot produce those ids."""
        if not any(req_id in self.rows for req_id in req_ids):
            return None
        packed = torch.from_numpy(self.output.grammar_bitmask)[:, :words]
        rows = torch.full((len(req_ids), words), -1, dtype=torch.int32)
        for i, req_id in enumerate(req_ids):
            if req_id in self.rows:
                rows[i] = 0
                rows[i, : packed.shape[1]] = packed[self.rows[req_id]]
        return rows
