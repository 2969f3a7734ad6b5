"""Draft-model speculation: a second, smaller export of this plugin proposes each request's next k tokens greedily.

`--speculative-config '{"method": "draft_model", "model": "<draft export dir>", "num_speculative_tokens": k}'`.
The draft is loaded with the runtime in the same worker, on the same backend, and keeps its own KV cache (its own
block allocator, runtime/block_tables.py): its slot i belongs to the request in the target's batch row i (the
runner's rows, runner/rows.py), so it is reused with it. Each slot remembers which tokens its draft cache holds
(position j holds record[j]); a request's drafts start from the longest prefix of its tokens the record shares, so
whatever a slot held before (an earlier request, a preempted one, a prefix-cache hit) is reused as far as it is true,
and rejected drafts fall out of the record. The record also remembers the token list it was last matched with and how
far it agrees with it: a request's list only grows (RequestState.all_token_ids), so the next proposal compares only
what was fed after that point (the drafts, at most k tokens), and a step's host work does not grow with the context.
A target's prefix-cache hit is not the draft's: the draft prefills what its slot's record does not hold.

Per proposal, for each request with tokens t_0..t_{N-1}:
- catch up: the draft cache must hold t_0..t_{N-2}. A long gap (a new prompt, a resumed request) goes through the
  draft's chunk loop (runtime.prefill_batch) with t_{N-1} at its end, whose logits give the first draft; one
  missing token (all k drafts were accepted: the last draft was never fed) is fed by a decode call;
- k greedy token_generation calls, batched over the requests: t_{N-1} -> d_1, d_1 -> d_2, ... (fewer near the end
  of the sequence: drafts never pass max_model_len).

The drafts are argmax choices: the draft distribution is one-hot, so speculative.accept's rule for a deterministic
draft (accept d with probability p(d), else draw from p without d) is exact for sampled requests too, and greedy
requests get exactly their greedy tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ... import artifact
from ...config import NeuronConfig
from ...errors import ArtifactError
from ...runtime import NeuronModelForCausalLM
from ...sampling import GREEDY
from ..log import WarmUpLog, get_logger

logger = get_logger(__name__)

DRAFT_MODEL = "draft_model"
SHORT_GAP = 2  # tokens a draft slot may be behind (the last one included) and catch up by decode calls


def draft_problems(
    draft_dir: str | None, target: NeuronConfig, target_dir: str, vocab_size: int, max_model_len: int
) -> list[str]:
    """What makes `draft_dir` unusable as the draft of the target artifact, with what to change."""
    use = "--speculative-config model"
    if not draft_dir:
        return [f"{use} is missing: give the directory of a draft exported with `optimum-cli export neuron`"]
    directory = Path(draft_dir)
    if not directory.is_dir():
        return [f"{use} {draft_dir!r} is not a directory: give the output directory of `optimum-cli export neuron`"]
    try:
        draft = artifact.load_neuron_config(directory)
        _, args = artifact.load_config(directory)
    except ArtifactError as error:
        return [
            f"{use} {draft_dir!r} is not a model exported with this plugin ({error}): export the draft with "
            "`optimum-cli export neuron --model <draft hf model> <dir>` and give that directory"
        ]
    export = "export the draft again with"
    problems = []
    if args.vocab_size != vocab_size:
        problems.append(
            f"the draft's vocabulary ({args.vocab_size} tokens) differs from the target's ({vocab_size}): use a draft "
            "model of the same tokenizer"
        )
    elif not _same_tokenizer(directory, Path(target_dir)):
        problems.append("the draft's tokenizer differs from the target's: use a draft model of the same tokenizer")
    if draft.batch_size < target.batch_size:
        problems.append(f"the draft's batch_size {draft.batch_size} is below the target's: {export} --batch-size "
                        f"{target.batch_size}")  # fmt: skip
    if draft.sequence_length < max_model_len:
        problems.append(
            f"the draft's sequence_length {draft.sequence_length} is below max_model_len {max_model_len}: {export} "
            f"--sequence-length {max_model_len} (or lower --max-model-len)"
        )
    if not draft.prefill_chunk_size:
        problems.append(f"the draft has no chunked_prefill graphs: {export} --prefill-chunk-size (e.g. 128)")
    if draft.backend != target.backend:
        problems.append(f"the draft was exported for the {draft.backend} backend, the target for {target.backend}: "
                        f"{export} --backend {target.backend}")  # fmt: skip
    if draft.tp_degree != 1:
        problems.append(f"the draft is split over {draft.tp_degree} ranks: {export} --tensor-parallel-size 1")
    return problems


def _same_tokenizer(draft: Path, target: Path) -> bool:
    """Both tokenizer.json vocabularies are the same (true when either directory has none to compare)."""
    vocabularies = [_vocabulary(d / "tokenizer.json") for d in (draft, target)]
    return None in vocabularies or vocabularies[0] == vocabularies[1]


def _vocabulary(path: Path) -> dict | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    added = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    return {**data.get("model", {}).get("vocab", {}), **added}


@dataclass
class _Row:
    slot: int
    tokens: list[int]  # the request's tokens: prompt and output
    wanted: int  # drafts to propose
    drafts: list[int] = field(default_factory=list)
    held: int = 0  # of its tokens, how many the slot's draft cache holds


class DraftModelDrafts:
    """The draft export and its per-slot records; propose() runs its graphs (module docstring)."""

    def __init__(self, draft_dir: str, k: int, max_model_len: int) -> None:
        logger.info("loading the draft model exported at %s", draft_dir)
        self.model = NeuronModelForCausalLM.from_pretrained(draft_dir)
        self.k, self.max_model_len = k, max_model_len
        self.records: dict[int, list[int]] = {}  # slot -> the tokens its draft cache holds, position by position
        self.matched: dict[int, tuple[list[int], int]] = {}  # slot -> (a token list, how many first tokens it shares)

    def warm_up(self) -> None:
        self.model.warm_up(WarmUpLog(logger, "the draft model"))
        self.records.clear()  # the warm-up wrote slot 0
        self.matched.clear()

    def propose(self, slots: Sequence[int], token_lists: Sequence[list[int]]) -> list[list[int]]:
        """Each request's greedy drafts (at most k) given its slot and all its tokens. A draft graph that raises
        costs only this step's drafts (the requests decode on without): the slots involved are forgotten."""
        rows = [_Row(s, t, min(self.k, self.max_model_len - len(t))) for s, t in zip(slots, token_lists, strict=True)]
        active = [row for row in rows if row.wanted > 0]
        try:
            self._draft(active)
        except Exception as error:  # noqa: BLE001 - drafts are optional: the requests verify none this step
            logger.warning("the draft model raised %s: %s; no drafts this step", type(error).__name__, error)
            for row in active:
                self.records.pop(row.slot, None)
                self.matched.pop(row.slot, None)
                row.drafts = []
        return [row.drafts for row in rows]

    def _draft(self, rows: list[_Row]) -> None:
        for row in rows:
            row.held = self._held(row)
        gaps = [len(row.tokens) - row.held for row in rows]
        if any(gap > SHORT_GAP for gap in gaps):
            self._prefill([row for row, gap in zip(rows, gaps, strict=True) if gap > SHORT_GAP])
        lagging = [row for row, gap in zip(rows, gaps, strict=True) if gap == SHORT_GAP]
        if lagging:  # feed t_{N-2} first; its next-token choice is not needed
            self._decode(lagging, [row.tokens[-2] for row in lagging])
        while running := [row for row in rows if len(row.drafts) < row.wanted]:
            fed = [row.drafts[-1] if row.drafts else row.tokens[-1] for row in running]
            for row, token in zip(running, self._decode(running, fed), strict=True):
                row.drafts.append(token)
        for row in rows:  # every token of the row was fed, then its drafts
            self.matched[row.slot] = (row.tokens, len(row.tokens))

    def _held(self, row: _Row) -> int:
        """How many of the row's first tokens its slot's draft cache holds (at most all but the last); the record
        is cut there. The part known to agree (the same list, matched before) is not compared again."""
        record = self.records.setdefault(row.slot, [])
        tokens, known = self.matched.pop(row.slot, (None, 0))
        known = min(known, len(row.tokens) - 1) if tokens is row.tokens else 0
        held = known + _common_prefix(record, row.tokens, known, len(row.tokens) - 1)
        del record[held:]
        return held

    def _prefill(self, rows: list[_Row]) -> None:
        """The chunk loop over each row's missing tokens, side by side: the first draft from the last's logits."""
        logits = self.model.prefill_batch([(row.slot, row.tokens[row.held :], row.held) for row in rows])
        for row, row_logits in zip(rows, logits, strict=True):
            self.records[row.slot].extend(row.tokens[row.held :])
            row.drafts.append(int(row_logits.argmax()))

    def _decode(self, rows: list[_Row], tokens: list[int]) -> list[int]:
        """One greedy token_generation call: each row's token at the end of its slot's record."""
        slots = [row.slot for row in rows]
        positions = [len(self.records[slot]) for slot in slots]
        result = self.model.decode(slots, tokens, positions, [GREEDY] * len(rows))
        for slot, token in zip(slots, tokens, strict=True):
            self.records[slot].append(token)
        return result.tokens


def _common_prefix(a: list[int], b: list[int], start: int, stop: int) -> int:
    """Length of the longest run where a and b agree from `start` on, up to `stop` (list slices compare in C; a
    mismatch is found by bisection)."""
    n = min(len(a), len(b), stop)
    if n <= start:
        return 0
    if a[start:n] == b[start:n]:
        return n - start
    same, differs = start, n
    while differs - same > 1:
        middle = (same + differs) // 2
        if a[start:middle] == b[start:middle]:
            same = middle
        else:
            differs = middle
    return same - start
