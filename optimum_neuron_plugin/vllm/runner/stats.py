"""Per-request prefill figures for benchmarks.

When ONP_STATS_FILE names a file, the runner appends one JSON line per finished request:
{"req_id", "prompt_tokens", "output_tokens", "prefill_calls", "prefill_seconds", "prefill_steps",
"interleaved", "batched", "cached_tokens", "draft_tokens", "accepted_tokens"}. `interleaved` is true when a
step that prefilled this request also decoded others, `batched` when its prompt was prefilled together with other
prompts (prefill_batch_size > 1), `cached_tokens` the tokens of vLLM's prefix-cache hit it started from (whole
blocks), `draft_tokens` / `accepted_tokens` the speculative draft tokens verified / accepted.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from .request_state import RequestState

STATS_FILE_ENV = "ONP_STATS_FILE"


class StatsSink:
    def __init__(self, path: str | Path | None = None) -> None:
        path = path or os.environ.get(STATS_FILE_ENV)
        self.path = Path(path) if path else None

    def finished(self, state: RequestState) -> None:
        if self.path is None:
            return
        record = {
            "req_id": state.req_id,
            "prompt_tokens": len(state.prompt_token_ids),
            "output_tokens": len(state.output_token_ids),
            **asdict(state.stats),
        }
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
