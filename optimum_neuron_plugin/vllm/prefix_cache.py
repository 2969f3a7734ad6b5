"""Cache slots and the token prefix each slot's KV rows hold: the prefix cache (pure bookkeeping, no vLLM).

The compiled KV cache has batch_size rows (slots); a request owns one from admission until it finishes. A finished
request's rows stay as they are until the slot is reused, so a free slot still holds the K/V of the tokens its last
owner really computed. A new request goes into the free slot holding its longest prefix and starts prefilling after
it: the hit. A hit is the longest common prefix, token-exact (the chunk loop starts at any position: the prefill
graphs take each row's start), and never reaches the prompt's last token, which must be prefilled to produce the
first token's logits.

With `copies` (the artifact has copy_prefix graphs) a prefix is also found in an owned slot: a running request's
rows [0, committed) hold its first committed tokens (they are never written again while it runs). When the longest
hit is there, the request still takes the best free slot and its claim carries a copy (source, destination, hit):
the runner copies those rows into the request's slot before any other graph call of the step, while the source's
rows still hold what was committed. Among equal hits the free slot wins (no copy).

Invariant: a slot's `tokens` are only tokens whose K/V a step the runner reported successful wrote into its rows
(`commit`). A request's steps write positions from its hit onward, so the tokens before the hit stay valid; a
failed or aborted step commits nothing, so its slot is never a hit beyond what earlier steps wrote. A claim with a
copy commits nothing until its first step succeeds (a failed copy leaves its rows unknown); until then, a later
claim of the same step that finds the prefix there copies from the same source instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Slot:
    index: int
    tokens: list[int] = field(default_factory=list)  # the prefix whose K/V the rows hold (valid while free)
    last_used: int = 0  # LRU clock: when it was last released
    owner: str | None = None  # the request that owns (or reserved) it


@dataclass(frozen=True)
class Claim:
    slot: int
    hit: int  # tokens whose K/V the slot holds (after the copy): the request starts prefilling there
    source: int | None = None  # a copy: the owned slot whose rows [0, hit) are copied onto `slot` first


@dataclass(frozen=True)
class PrefixCopy:
    """What the runner does before a step's other graph calls: rows [0, length) of source onto destination."""

    req_id: str
    source: int
    destination: int
    length: int


class SlotExhaustedError(RuntimeError):
    """vLLM scheduled more requests than there are cache rows (a plugin or configuration bug)."""


def prefix_hit(cached: list[int], token_ids: list[int]) -> int:
    """The common prefix of cached and token_ids, leaving at least the last token to prefill."""
    limit = min(len(cached), len(token_ids) - 1)
    common = 0
    while common < limit and cached[common] == token_ids[common]:
        common += 1
    return common


class PrefixCache:
    """Which slot each request owns and which prefix each free slot holds.

    enabled False: slots are still assigned here (LRU), every hit is 0. copies: owned slots' prefixes are hits too,
    copied into the claimed slot.
    """

    def __init__(self, batch_size: int, enabled: bool, copies: bool = False) -> None:
        self.slots = [Slot(i) for i in range(batch_size)]
        self.enabled, self.copies = enabled, enabled and copies
        self._owned: dict[str, Slot] = {}
        self._committed: dict[str, int] = {}  # req_id -> tokens its successful steps wrote (from position 0)
        self._tokens: dict[str, list[int]] = {}  # req_id -> its tokens at the claim (what its rows come to hold)
        self._pending: dict[str, Claim] = {}  # claims with a copy, until their first step commits
        self._clock = 0

    def peek(self, token_ids: list[int]) -> int:
        """The hit a request would get now (no reservation)."""
        return self._best(token_ids).hit if self.num_free else 0

    def claim(self, req_id: str, token_ids: list[int], lookup: bool = True) -> Claim:
        """Reserve the free slot holding the longest prefix of token_ids (the least recently used one
        on a miss). lookup False (e.g. the request skips the prefix cache): the LRU slot, hit 0."""
        if req_id in self._owned:
            self.unclaim(req_id)
        if not self.num_free:
            raise SlotExhaustedError("no free KV cache slot: vLLM scheduled more requests than the compiled batch_size")
        claim = self._best(token_ids) if lookup else Claim(self._lru().index, 0)
        slot = self.slots[claim.slot]
        slot.owner = req_id
        self._owned[req_id] = slot
        self._tokens[req_id] = list(token_ids)
        self._committed[req_id] = claim.hit if claim.source is None else 0
        if claim.source is not None:
            self._pending[req_id] = claim
        return claim

    def unclaim(self, req_id: str) -> None:
        """Undo a claim whose request was not admitted: the slot keeps what it held (no copy was made)."""
        slot = self._owned.pop(req_id)
        slot.owner = None
        self._forget(req_id)

    def commit(self, req_id: str, num_tokens: int) -> None:
        """A step of req_id succeeded: its rows hold K/V of its first num_tokens tokens."""
        if req_id in self._committed:
            self._committed[req_id] = num_tokens
            self._pending.pop(req_id, None)

    def copy_of(self, req_id: str) -> PrefixCopy | None:
        """The copy req_id's claim carries, before its first step commits."""
        claim = self._pending.get(req_id)
        return None if claim is None else PrefixCopy(req_id, claim.source, claim.slot, claim.hit)

    def release(self, req_id: str, token_ids: list[int]) -> int | None:
        """req_id finished or was preempted: its slot is free and holds token_ids[:committed]. Returns the slot."""
        slot = self._owned.pop(req_id, None)
        if slot is None:
            return None
        written = self._committed[req_id]
        self._forget(req_id)
        slot.tokens = list(token_ids[:written]) if self.enabled else []
        slot.owner = None
        self._clock += 1
        slot.last_used = self._clock
        return slot.index

    def _forget(self, req_id: str) -> None:
        for records in (self._committed, self._tokens, self._pending):
            records.pop(req_id, None)

    def forget(self) -> None:
        """Free slots hold nothing reusable any more (vLLM's reset_prefix_cache)."""
        for slot in self._free():
            slot.tokens = []

    def slot_of(self, req_id: str) -> int | None:
        slot = self._owned.get(req_id)
        return None if slot is None else slot.index

    @property
    def num_free(self) -> int:
        return len(self.slots) - len(self._owned)

    def _free(self) -> list[Slot]:
        return [s for s in self.slots if s.owner is None]

    def _lru(self) -> Slot:
        return min(self._free(), key=lambda s: s.last_used)

    def _best(self, token_ids: list[int]) -> Claim:
        if not self.enabled:
            return Claim(self._lru().index, 0)
        # Longest hit; among equal hits the least recently used slot (the others stay for later requests).
        hit, _, index = max((prefix_hit(s.tokens, token_ids), -s.last_used, s.index) for s in self._free())
        held, source = self._best_owned(token_ids) if self.copies else (0, None)
        return Claim(index, held, source) if held > hit else Claim(index, hit)

    def _best_owned(self, token_ids: list[int]) -> tuple[int, int | None]:
        """The longest hit in an owned slot's committed prefix, and the slot to copy it from: the slot itself, or
        for a claim whose copy has not run yet, that copy's source (its rows are what the copy will bring)."""
        best = (0, None)
        for req_id, slot in self._owned.items():
            pending = self._pending.get(req_id)
            held, source = (pending.hit, pending.source) if pending else (self._committed[req_id], slot.index)
            hit = prefix_hit(self._tokens[req_id][:held], token_ids)
            if hit > best[0]:
                best = (hit, source)
        return best
