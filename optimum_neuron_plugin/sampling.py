"""Host side of sampling: per-request parameters, random draws, and the host sampler for logits.

The first token of every request is sampled here from the prefill logits; later tokens are
sampled on device by token_generation (hybrid), or here when the artifact has no on-device sampling.
Decision: every token of a request follows one rule. The device sampler keeps at most max_topk tokens
(top_k <= 0 means max_topk there), so when the artifact samples on device the host applies the same cap
to the first token; without on-device sampling the host uses the full vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models.sampling import sample


@dataclass(frozen=True)
class SamplingParams:
    top_k: int = 1  # 1 is greedy; <= 0 means no top-k limit (capped at max_topk on device)
    top_p: float = 1.0
    temperature: float = 1.0
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one (after temperature)
    # (token id, bias) pairs added to the logits before sampling, greedy included (on device: the decode graphs'
    # logit_bias input, at most max_logit_bias pairs; the host sampler leaves them to vLLM's processor).
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature <= 0

    def as_row(self, max_k: int) -> list[float]:
        if self.greedy:
            return [1.0, 1.0, 1.0, 0.0]
        top_k = max_k if self.top_k <= 0 else min(self.top_k, max_k)
        return [float(top_k), float(self.top_p), float(self.temperature), float(self.min_p)]


GREEDY = SamplingParams()


def make_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def draw_uniform(generators: list[torch.Generator | None]) -> torch.Tensor:
    """One uniform per row from the row's own generator ([n, 1]); rows without one get 0 (greedy)."""
    values = [torch.rand(1, generator=g) if g is not None else torch.zeros(1) for g in generators]
    return torch.stack(values) if values else torch.zeros(0, 1)


def params_tensor(params: list[SamplingParams], max_k: int) -> torch.Tensor:
    return torch.tensor([p.as_row(max_k) for p in params], dtype=torch.float32)


def host_topk(on_device_sampling: bool, max_topk: int) -> int | None:
    """The top-k cap of host sampling for an artifact: the device's cap when it samples on device, else none."""
    return max_topk if on_device_sampling else None


def sample_on_host(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    max_topk: int | None = None,
) -> torch.Tensor:
    """logits [n, V] -> token ids [n], with the on-device sampler's algorithm over at most max_topk tokens
    (None: the full vocabulary). Running sums use torch.cumsum: the graphs' triangular matmul would need a V x V
    matrix over a whole vocabulary (9.7 GB for 49152 tokens)."""
    k = logits.shape[-1] if max_topk is None else min(max_topk, logits.shape[-1])
    if all(p.greedy for p in params):
        return logits.argmax(dim=-1)
    return sample(logits, params_tensor(params, k), draw_uniform(generators), k, running_sum=_cumsum)


def _cumsum(probs: torch.Tensor) -> torch.Tensor:
    return probs.cumsum(dim=-1)
