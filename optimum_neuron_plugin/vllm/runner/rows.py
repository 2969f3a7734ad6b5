"""Which batch row each request's block table is written to, and the step's order of dependent prompt slices.

vLLM's KV cache manager owns the KV blocks; the graphs take, per call row, the block table of a row of the batch
(runtime/block_tables.py). The runner gives each request a row (0..batch_size-1) when it is scheduled, keeps it until
the request finishes or is preempted, and before the step's graph calls writes the request's vLLM block ids into
that row's table. A row holds no K/V of its own: taking the row of a request that is not scheduled this step (a
streaming-input session waiting for its next input) costs it nothing; it gets a row again when it is scheduled.

vLLM hashes a request's full blocks when it allocates them, before the step writes them, so a request admitted later
in the same step may hit blocks that an earlier request of the step writes (a shared system prompt arriving in one
wave). Such a slice reads them only after they are written: waves() puts it in a later wave than their writers.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .step_input import ScheduledSlice


class Rows:
    def __init__(self, count: int) -> None:
        self.count = count
        self.owners: dict[int, str] = {}  # row -> request

    def take(self, req_id: str, keep: Collection[str]) -> tuple[int, str | None]:
        """A row for req_id: a free one, else one whose request is not in `keep` (this step's). Returns the row and
        the request it was taken from (None: it was free)."""
        free = next((row for row in range(self.count) if row not in self.owners), None)
        if free is not None:
            self.owners[free] = req_id
            return free, None
        row, owner = next(((r, o) for r, o in self.owners.items() if o not in keep), (None, None))
        if row is None:
            raise RuntimeError(
                f"no batch row for request {req_id}: vLLM scheduled more than the compiled batch_size={self.count}"
            )
        self.owners[row] = req_id
        return row, owner

    def release(self, row: int) -> None:
        self.owners.pop(row, None)


@dataclass(frozen=True)
class SliceBlocks:
    """A scheduled slice and its request's block ids (vLLM's, in position order)."""

    work: ScheduledSlice
    block_ids: Sequence[int]

    def reads(self, block_size: int) -> Iterable[int]:
        """The blocks of the positions before the slice (its context)."""
        return self.block_ids[: -(-self.work.start // block_size)]

    def writes(self, block_size: int) -> Iterable[int]:
        end = self.work.start + self.work.count + len(self.work.drafts)
        return self.block_ids[self.work.start // block_size : -(-end // block_size)]


@dataclass
class Waves:
    """The step's slices by wave (0 first): a slice reads no block that a slice of its own or a later wave writes.
    producers: req_id -> the requests whose writes this step its slice reads."""

    levels: dict[str, int] = field(default_factory=dict)
    producers: dict[str, set[str]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return 1 + max(self.levels.values(), default=0)


def waves(slices: Sequence[SliceBlocks], block_size: int) -> Waves:
    """The waves of the step's slices (a block has one writer in a step: the request it was allocated to)."""
    writer = {block: s.work.req_id for s in slices for block in s.writes(block_size)}
    result = Waves()
    for s in slices:
        req_id = s.work.req_id
        producers = {writer[b] for b in s.reads(block_size) if writer.get(b, req_id) != req_id}
        if producers:
            result.producers[req_id] = producers
    result.levels = dict.fromkeys((s.work.req_id for s in slices), 0)
    for _ in slices:  # longest producer chain: at most one pass per slice
        for req_id, producers in result.producers.items():
            result.levels[req_id] = 1 + max(result.levels[p] for p in producers)
    return result
