"""Prompt logprobs as vLLM's GPU runner computes them (gpu_model_runner._get_prompt_logprobs_dict): the raw
log-softmax of the logits at prompt position i, gathered for the top n and the prompt token i + 1 with its rank,
for positions 0..P-2 of a P-token prompt. The logits come from the prompt_logits graphs (runtime.prefill_positions);
a request's slices fill one LogprobsTensors, handed to vLLM in the step that completes its prompt."""

from __future__ import annotations

import torch
from vllm.v1.outputs import LogprobsTensors

from ..compat import gather_logprobs, raw_logprobs
from .request_state import RequestState


def wants_prompt_logprobs(state: RequestState) -> bool:
    """Asked for and not yet handed to vLLM (a preempted request prefilled again sends them once, as vLLM)."""
    return state.params.prompt_logprobs is not None and not state.prompt_logprobs_sent


def record_prompt_logprobs(state: RequestState, logits: torch.Tensor, start: int) -> LogprobsTensors | None:
    """logits [count, vocab] of prompt positions [start, start + count): fills their rows of the request's prompt
    logprobs. Returns them once the slice reaches the end of the prompt (None before, and for tokens past it)."""
    prompt = state.prompt_token_ids
    if start >= len(prompt):
        return None
    if state.prompt_logprobs is None:
        state.prompt_logprobs = LogprobsTensors.empty_cpu(len(prompt) - 1, _top(state, logits.shape[-1]) + 1)
    rows = min(len(logits), len(prompt) - 1 - start)  # the last prompt position predicts the first output token
    if rows > 0:
        targets = torch.tensor(prompt[start + 1 : start + 1 + rows])
        scores = raw_logprobs(logits[:rows].float())
        ids, values, ranks = gather_logprobs(scores, _top(state, logits.shape[-1]), targets)[:3]
        window = slice(start, start + rows)
        state.prompt_logprobs.logprob_token_ids[window] = ids
        state.prompt_logprobs.logprobs[window] = values
        state.prompt_logprobs.selected_token_ranks[window] = ranks
    if start + len(logits) < len(prompt):
        return None
    done, state.prompt_logprobs, state.prompt_logprobs_sent = state.prompt_logprobs, None, True
    return done


def _top(state: RequestState, vocab: int) -> int:
    asked = state.params.prompt_logprobs
    return vocab if asked == -1 else asked
