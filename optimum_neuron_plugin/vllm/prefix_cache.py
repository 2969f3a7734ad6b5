"""Cache slots and the token prefix each slot's KV rows hold: the prefix cache (pure bookkeeping, no vLLM).

The compiled KV cache has batch_size rows (slots); a request owns one from admission until it finishes. A finished
request's rows stay as they are until the slot is reused, so a free slot still holds the K/V of the tokens its last
owner really computed. A new request goes into the free slot holding its longest prefix and starts prefilling after
it: the hit. A hit is the longest common prefix, token-exact (the chunk loop starts at any position: the prefill
graphs take each row's start), and never reaches the prompt's last token, which must be prefilled to produce the
first token's logits.

Invariant: a slot's `tokens` are only tokens whose K/V a step the runner reported successful wrote into its rows
(`commit`). A request's steps write positions from its hit onward, so the tokens before the hit stay valid; a
failed or aborted step commits nothing, so its slot is never a hit beyond what earlier steps wrote.
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
    hit: int  # tokens whose K/V the slot already holds: the request starts prefilling there


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

    enabled False: slots are still assigned here (LRU), every hit is 0.
    """

    def __init__(self, batch_size: int, enabled: bool) -> None:
        self.slots = [Slot(i) for i in range(batch_size)]
        self.enabled = enabled
        self._owned: dict[str, Slot] = {}
        self._committed: dict[str, int] = {}  # req_id -> tokens its successful steps wrote (from position 0)
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
        self._committed[req_id] = claim.hit
        return claim

    def unclaim(self, req_id: str) -> None:
        """Undo a claim whose request was not admitted: the slot keeps what it held."""
        slot = self._owned.pop(req_id)
        slot.owner = None
        del self._committed[req_id]

    def commit(self, req_id: str, num_tokens: int) -> None:
        """A step of req_id succeeded: its rows hold K/V of its first num_tokens tokens."""
        if req_id in self._committed:
            self._committed[req_id] = num_tokens

    def release(self, req_id: str, token_ids: list[int]) -> int | None:
        """req_id finished or was preempted: its slot is free and holds token_ids[:committed]. Returns the slot."""
        slot = self._owned.pop(req_id, None)
        if slot is None:
            return None
        written = self._committed.pop(req_id)
        slot.tokens = list(token_ids[:written]) if self.enabled else []
        slot.owner = None
        self._clock += 1
        slot.last_used = self._clock
        return slot.index

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
        return Claim(index, hit)
