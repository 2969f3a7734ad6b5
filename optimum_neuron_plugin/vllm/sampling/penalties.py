"""Repetition, frequency and presence penalties from token counts kept per request.

vLLM's V1 sampler (vllm/model_executor/layers/utils.py apply_penalties) counts every row's prompt and output tokens
over the vocabulary on each call: the whole context, each step. Here each request keeps its prompt's token mask (built
once) and its output tokens' counts, updated with the tokens sampled since the last call, and the penalties are
vLLM's formulas on them: the repetition penalty divides positive logits and multiplies the others of tokens seen in the
prompt or the output, then `logits -= frequency * count + presence * (count > 0)` over output tokens (OpenAI's
definition), in vLLM's order and float32 arithmetic, so the logits are the ones vLLM's sampler gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.sampling_params import SamplingParams as VllmSamplingParams


@dataclass
class PenaltyCounts:
    """One request's tokens over the vocabulary: what its penalties read."""

    prompt_mask: torch.Tensor  # [V] bool: the token occurs in the prompt
    output_counts: torch.Tensor  # [V] int64: occurrences in the output
    counted: int = 0  # output tokens counted so far

    @classmethod
    def of_prompt(cls, prompt_token_ids: list[int], vocab: int) -> PenaltyCounts:
        prompt_mask = torch.zeros(vocab, dtype=torch.bool)
        prompt_mask[torch.tensor(prompt_token_ids, dtype=torch.int64)] = True
        return cls(prompt_mask, torch.zeros(vocab, dtype=torch.int64))

    def update(self, output_token_ids: list[int]) -> None:
        """Counts the output tokens appended since the last update (output_token_ids only grows)."""
        new = output_token_ids[self.counted :]
        if new:
            ids = torch.tensor(new, dtype=torch.int64)
            self.output_counts.index_put_((ids,), torch.ones_like(ids), accumulate=True)
            self.counted = len(output_token_ids)


def has_penalties(params: VllmSamplingParams) -> bool:
    return params.presence_penalty != 0.0 or params.frequency_penalty != 0.0 or params.repetition_penalty != 1.0


def apply_penalties(logits: torch.Tensor, params: list[VllmSamplingParams], counts: list[PenaltyCounts | None]) -> None:
    """logits [n, V] (float32, in place): row i penalised by params[i] over counts[i] (None for a row without
    penalties). Rows without penalties are left as they are (vLLM's formulas with repetition 1 and frequency / presence 0 change no logit)."""
    rows = [i for i, p in enumerate(params) if has_penalties(p)]
    if not rows:
        return
    chosen = [params[i] for i in rows]
    value = lambda name: torch.tensor([getattr(p, name) for p in chosen], dtype=torch.float32)[:, None]  # noqa: E731
    prompt_mask = torch.stack([counts[i].prompt_mask for i in rows])
    output_counts = torch.stack([counts[i].output_counts for i in rows])
    output_mask = output_counts > 0
    row_logits = logits[rows]
    repetition = torch.where(prompt_mask | output_mask, value("repetition_penalty"), 1.0)
    row_logits *= torch.where(row_logits > 0, 1.0 / repetition, repetition)
    row_logits -= value("frequency_penalty") * output_counts
    row_logits -= value("presence_penalty") * output_mask
    logits[rows] = row_logits
