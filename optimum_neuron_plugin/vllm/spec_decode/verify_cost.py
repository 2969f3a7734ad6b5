"""Whether a step's drafts pay for the verify call they need.

When one decoding row has drafts, every row that may speculate runs in the verify call: k + 1 positions per row
instead of one (runtime/verify.py). Next step's n decoding rows then yield n + sum(rate_i x drafts_i) tokens in the
time of a verify call of the m speculating rows plus a decode call of the n - m others, against n tokens in the time
of one decode call of all n rows; rate_i is request i's running acceptance (DraftGate) or, before its first verify,
the running acceptance of all verify calls (PooledRate: 1 before any). The drafts go to vLLM only when they yield
more tokens per second:

    sum(rate_i x drafts_i) > n x (verify time / decode time - 1)

Both times are measured once at startup (VerifyCosts.measure: every token_generation and verify graph, per row count
and context bucket; the host's acceptance of the returned logits is not in them). SmolLM2's cpu export (batch 4)
logged 1.77 decode calls per verify call of 4 rows: one row drafting among 4 then pays only above 0.77 acceptance of
4 drafts; with the draft gate alone such rows kept answers that do not quote their prompt at 0.85x plain decoding at
concurrency 4 (benchmark/results/20261126-speculative-ngram-k4-vs-vllm-cpu). Withheld drafts change no token, only speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...graphs import TOKEN_GENERATION, VERIFY
from ...runtime import NeuronModelForCausalLM
from ...runtime.latency import GraphLatencies


@dataclass
class PooledRate:
    """The acceptance of all requests' verified drafts, each verify call weighing half of what came before."""

    rate: float = 1.0

    def verified(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.rate = 0.5 * self.rate + 0.5 * accepted / drafted


@dataclass
class NextRow:
    """A request that decodes next step: its tokens so far, its drafts (none if it may not speculate) and rate."""

    num_tokens: int
    drafts: int
    rate: float
    speculates: bool = True


@dataclass
class VerifyCosts:
    latencies: GraphLatencies

    @classmethod
    def measure(cls, model: NeuronModelForCausalLM) -> VerifyCosts:
        """Every token_generation and verify graph's latency (runtime/latency.py; after the model's warm-up)."""
        return cls(model.measure_latencies(lambda spec: spec.name in (TOKEN_GENERATION, VERIFY)))

    def decode_seconds(self, model: NeuronModelForCausalLM, rows: Sequence[NextRow]) -> float:
        if not rows:
            return 0.0
        last = [self._last(model, r.num_tokens - 1) for r in rows]
        return self.latencies.of(model.select(TOKEN_GENERATION, len(rows), (), last))

    def verify_seconds(self, model: NeuronModelForCausalLM, rows: Sequence[NextRow]) -> float:
        last = [self._last(model, r.num_tokens - 1 + r.drafts) for r in rows]
        return self.latencies.of(model.select(VERIFY, len(rows), (), last))

    @staticmethod
    def _last(model: NeuronModelForCausalLM, position: int) -> int:
        return min(position, model.neuron_config.sequence_length - 1)

    def verify_over_decode(self, model: NeuronModelForCausalLM) -> dict[int, float]:
        """Per row count: a verify call's time over a decode call's, in their smallest buckets (for the log)."""
        rows = [[NextRow(1, 0, 0.0)] * n for n in model.neuron_config.decode_batch_sizes]
        return {len(r): round(self.verify_seconds(model, r) / self.decode_seconds(model, r), 2) for r in rows}

    def drafts_pay(self, model: NeuronModelForCausalLM, rows: Sequence[NextRow]) -> bool:
        """Whether verifying the rows' drafts yields more tokens per second than decoding without them."""
        speculating = [r for r in rows if r.speculates]
        if not any(r.drafts for r in speculating):
            return False
        others = [r for r in rows if not r.speculates]
        with_drafts = self.verify_seconds(model, speculating) + self.decode_seconds(model, others)
        expected = sum(r.rate * r.drafts for r in speculating)
        return (len(rows) + expected) / with_drafts > len(rows) / self.decode_seconds(model, rows)
