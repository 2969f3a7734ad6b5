"""When a request's drafts keep being rejected, stop proposing them for a while.

A request whose drafts are mostly rejected gains nothing from a verify call that costs more than a decode call
(benchmark/results/20261126-speculative-draft-model-k4-vs-ngram-vs-plain: answers that do not quote their prompt
accept 0.2 of SmolLM2's n-gram drafts and ran at 0.71x plain decoding without the gate). verify_cost.py prices each
step's drafts from the graphs' measured times; this gate also rests a request that keeps failing. Each request keeps
a running acceptance rate; below ONP_SPECULATION_MIN_ACCEPTANCE it decodes without drafts for a pause that doubles
each time (4, 8, ... 64 steps), then tries again. Drafts are optional in every step, so the output does not change,
only its speed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MIN_ACCEPTANCE_ENV = "ONP_SPECULATION_MIN_ACCEPTANCE"
DEFAULT_MIN_ACCEPTANCE = 0.35
FIRST_PAUSE, LONGEST_PAUSE = 4, 64


def min_acceptance() -> float:
    """ONP_SPECULATION_MIN_ACCEPTANCE (0 keeps drafting whatever the acceptance)."""
    value = os.environ.get(MIN_ACCEPTANCE_ENV, "")
    try:
        rate = float(value) if value.strip() else DEFAULT_MIN_ACCEPTANCE
    except ValueError:
        raise ValueError(f"{MIN_ACCEPTANCE_ENV}={value!r} is not a number: set a rate between 0 and 1") from None
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{MIN_ACCEPTANCE_ENV}={value!r} is outside [0, 1]: set a rate between 0 and 1")
    return rate


@dataclass
class DraftGate:
    """One request's running acceptance rate and pause (in steps without drafts)."""

    threshold: float
    rate: float = -1.0  # -1: no verify yet (the first verify's rate counts alone)
    pause: int = 0
    next_pause: int = FIRST_PAUSE

    def verified(self, drafted: int, accepted: int) -> None:
        """After a verify call in which the request's `drafted` drafts had `accepted` accepted."""
        if drafted == 0:
            return
        rate = accepted / drafted
        self.rate = rate if self.rate < 0 else 0.5 * self.rate + 0.5 * rate
        if self.rate >= self.threshold:
            self.next_pause = FIRST_PAUSE
            return
        self.pause, self.next_pause = self.next_pause, min(2 * self.next_pause, LONGEST_PAUSE)
        self.rate = self.threshold  # after the pause one good verify keeps it drafting, one bad one pauses again

    def open(self) -> bool:
        """Whether to propose drafts after this step; counts the paused step down."""
        if self.pause > 0:
            self.pause -= 1
            return False
        return True
