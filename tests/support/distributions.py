"""Next-token distributions computed from Hugging Face logits, and a distribution-free test against them.

`expected` is written independently of the plugin's sampler, in float64, with vLLM's meaning of the
parameters: temperature first, then top-k (top_k <= 0: no limit, but at most `cap` tokens: the artifact's
max_topk when it samples on device), then top-p (keep the most likely tokens while the mass before them is
below top_p), renormalised.

The test works on ranks: each draw becomes the rank of the sampled token under its own context's logits,
so draws from different contexts (different prompts, or a token sampled after different earlier tokens)
pool into one distribution over ranks 0..K-1: the mean of their expected rank distributions. For K
categories and N independent draws (or draws each from a known distribution given the previous ones: the
bound is Azuma-Hoeffding's, over every subset of categories) the L1 distance between the empirical and the
expected distribution exceeds eps with probability at most 2**K * exp(-N * eps**2 / 2)
(Bretagnolle-Huber-Carol). `l1_bound` solves that for eps at a given false-failure probability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

# Contexts whose kept set could change with float noise between HF and the graphs (two logits within this
# many nats at the top-k edge, or the mass before a token within this much of top_p) are left out: the
# choice depends on HF's logits only, never on the draw, so it biases nothing.
AMBIGUITY = 1e-3


@dataclass(frozen=True)
class Params:
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0


def expected(logits: torch.Tensor, params: Params, cap: int | None = None) -> tuple[np.ndarray, bool]:
    """(probabilities over the vocabulary in descending-logit order, whether the context is ambiguous)."""
    values = np.sort(logits.double().numpy())[::-1] / params.temperature
    vocab = len(values)
    k = vocab if params.top_k <= 0 else params.top_k
    k = min(k, cap or vocab, vocab)
    ambiguous = k < vocab and values[k - 1] - values[k] < AMBIGUITY
    probs = np.exp(values[:k] - values[0])
    probs /= probs.sum()
    before = np.cumsum(probs) - probs
    ambiguous |= bool(np.any(np.abs(before - params.top_p) < AMBIGUITY)) and params.top_p < 1.0
    kept = before < params.top_p
    out = np.zeros(vocab)
    out[:k] = np.where(kept, probs, 0.0)
    return out / out.sum(), bool(ambiguous)


def ranks(logits: torch.Tensor, tokens: torch.Tensor) -> np.ndarray:
    """logits [n, V], tokens [n] -> rank of each token under its row's logits (0: the most likely)."""
    order = torch.argsort(logits.double(), dim=-1, descending=True, stable=True)
    return (order == tokens[:, None]).int().argmax(dim=-1).numpy()


def l1_bound(categories: int, draws: int, failure: float) -> float:
    """eps with 2**categories * exp(-draws * eps**2 / 2) = failure."""
    return math.sqrt(2 * (categories * math.log(2) + math.log(1 / failure)) / draws)


def detects(
    logits: torch.Tensor, params: Params, cap: int | None, alternative: Params, alt_cap: int | None, failure: float
) -> bool:
    """Whether `compare(logits, ..., params, cap, failure)` fails, with probability above 1 - 1e-3, for a
    sampler that follows `alternative` instead: it draws excluded tokens (more than 16 expected: none drawn
    has probability below 1e-7), or its rank distribution lies farther than the test's bound plus the
    alternative's own deviation at 1e-3."""
    want = np.stack([expected(row, params, cap)[0] for row in logits])
    other = np.stack([expected(row, alternative, alt_cap)[0] for row in logits])
    if (other * (want == 0)).sum() > 16:
        return True
    categories = int(((want > 0) | (other > 0)).any(axis=0).sum())
    distance = float(np.abs(want.mean(axis=0) - other.mean(axis=0)).sum())
    return distance > l1_bound(categories, len(logits), failure) + l1_bound(categories, len(logits), 1e-3)


@dataclass
class Verdict:
    draws: int
    l1: float
    bound: float
    empirical: np.ndarray
    expected: np.ndarray
    outside: int  # draws of a token the parameters exclude

    def explain(self) -> str:
        return (
            f"{self.draws} draws, {self.outside} outside the kept tokens, L1 {self.l1:.3f} (bound {self.bound:.3f})\n"
            f"  empirical by rank {self.empirical.round(3).tolist()}\n  expected  by rank {self.expected.round(3).tolist()}"
        )


def compare(logits: torch.Tensor, tokens: torch.Tensor, params: Params, cap: int | None, failure: float) -> Verdict:
    """Sampled tokens [n], each drawn from its own context's logits [n, V], against `expected`."""
    rows = [expected(row, params, cap) for row in logits]
    keep = np.array([not ambiguous for _, ambiguous in rows])
    probs = np.stack([p for p, _ in rows])[keep]
    drawn = ranks(logits, tokens)[keep]
    outside = int((probs[np.arange(len(drawn)), drawn] == 0).sum())
    categories = int((probs > 0).any(axis=0).sum())
    mean = probs[:, :categories].mean(axis=0)
    empirical = np.bincount(drawn, minlength=logits.shape[-1])[:categories] / len(drawn)
    l1 = float(np.abs(empirical - mean).sum()) + outside / len(drawn)
    return Verdict(len(drawn), l1, l1_bound(categories, len(drawn), failure), empirical, mean, outside)
