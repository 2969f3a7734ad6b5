"""Acceptance of speculative draft tokens on the host, from the verify graph's logits of every position.

A row fed its last sampled token and drafts d_1..d_n gets logits l_0..l_n: l_i is the target distribution of the
token after d_i (after the last sampled token for i = 0). The row keeps d_1..d_a and one more token:
- greedy: a is the first i with argmax(l_{i-1}) != d_i, and the extra token is argmax(l_a): exactly the tokens
  greedy decoding without drafts would produce;
- sampling: the rejection rule for a deterministic draft (n-gram lookup: the draft distribution q is one-hot):
  d_i is accepted with probability p_{i-1}(d_i), p being the distribution the sampler draws from (temperature,
  top-k, top-p: models.sampling.sorted_probs); at the first rejection the extra token is drawn from p_{i-1} without
  d_i, renormalised (the residual max(p - q, 0)); after n acceptances from p_n. Each token is then distributed as
  sampling without drafts (Leviathan et al., 2023). The uniforms come from the request's own generator.
"""

from __future__ import annotations

import torch

from .models.sampling import sorted_probs
from .sampling import SamplingParams, draw_uniform, params_tensor


def accept(
    logits: torch.Tensor,
    drafts: list[int],
    params: SamplingParams,
    generator: torch.Generator | None,
    max_topk: int | None = None,
) -> list[int]:
    """logits [>= n + 1, V] of a row fed its last token and n drafts -> the accepted drafts and one more token.
    max_topk: the candidates' cap (the device sampler's on on-device-sampling artifacts), None: the vocabulary."""
    n = len(drafts)
    if params.greedy:
        best = logits[: n + 1].argmax(dim=-1).tolist()
        kept = next((i for i, draft in enumerate(drafts) if best[i] != draft), n)
        return drafts[:kept] + [best[kept]]
    probs = target_probs(logits[: n + 1], params, max_topk)
    for i, draft in enumerate(drafts):
        if _uniform(generator) >= probs[i, draft]:
            residual = probs[i].clone()
            residual[draft] = 0.0
            return drafts[:i] + [_draw(residual if residual.sum() > 0 else probs[i], _uniform(generator))]
    return drafts + [_draw(probs[n], _uniform(generator))]


def target_probs(logits: torch.Tensor, params: SamplingParams, max_topk: int | None) -> torch.Tensor:
    """[T, V] logits -> [T, V] the probabilities the sampler draws each position's token from."""
    k = logits.shape[-1] if max_topk is None else min(max_topk, logits.shape[-1])
    top_values, top_ids = torch.topk(logits.float(), k, dim=-1)
    rows = params_tensor([params] * logits.shape[0], k)
    probs = sorted_probs(top_values, rows, lambda p: p.cumsum(dim=-1))
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(logits, dtype=torch.float32).scatter(-1, top_ids, probs)


def _uniform(generator: torch.Generator | None) -> float:
    return float(draw_uniform([generator])[0, 0])


def _draw(probs: torch.Tensor, uniform: float) -> int:
    """Inverse-CDF draw from unnormalised probs [V], as the sampler draws (models.sampling)."""
    cdf = probs.cumsum(dim=-1)
    return int((cdf < uniform * cdf[-1]).sum().clamp(max=probs.shape[-1] - 1))
