"""Cache slots and the token prefix each slot's KV rows hold: the prefix cache (pure bookkeeping, no vLLM).

The compiled KV cache has batch_size rows (slots); a request owns one from admission until it finishes. A finished
request's rows stay as they are until the slot is reused, so a free slot still holds the K/V of the tokens its last
owner really computed. A new request goes into the free slot holding its longest prefix and starts prefilling after
it: the hit. A hit is the longest common prefix, token-exact (the chunk loop starts at any position: the prefill
graphs take each row's start), and never reaches the prompt's last token, which must be prefilled to produce the
first token's logits.

Lookup: by vLLM's chained block hashes (request.block_hashes: the hash of block i covers tokens [0, (i + 1) *
block_size) and the request's cache salt). An index maps each hash to the slots holding that block; since the hashes
are chained, a slot holding block i holds blocks 0..i-1 too, so the longest run of full blocks some slot holds is a
binary search over the request's hashes. Only inside the next, partial block are tokens compared, against the few
slots holding the whole run: a claim costs O(log blocks + slots x block_size), whatever the prompt's length.

With `copies` (the artifact has copy_prefix graphs) a prefix is also found in an owned slot: a running request's
rows [0, committed) hold its first committed tokens (they are never written again while it runs). When the longest
hit is there, the request still takes the best free slot and its claim carries a copy (source, destination, hit):
the runner copies those rows into the request's slot before any other graph call of the step, while the source's
rows still hold what was committed. Among equal hits the free slot wins (no copy).

Invariant: a slot's tokens are only tokens whose K/V a step the runner reported successful wrote into its rows
(`commit`). A request's steps write positions from its hit onward, so the tokens before the hit stay valid; a
failed or aborted step commits nothing, so its slot is never a hit beyond what earlier steps wrote. A claim with a
copy commits nothing until its first step succeeds (a failed copy leaves its rows unknown); until then, a later
claim of the same step that finds the prefix there copies from the same source instead.

The index also says which full blocks the cache can serve as hits (those of free slots, and with copies those of
owned slots): `take_changes` reports the blocks that came or went since the last call (KV-cache events, kv_events.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Prefix:
    """Tokens and vLLM's chained hashes of their full blocks (either may be a live list that grows)."""

    tokens: Sequence[int]
    hashes: Sequence[bytes]
    salt: str | None = None  # vLLM's cache_salt: part of the first block's hash, so of every hash

    def head(self, length: int, block_size: int) -> Prefix:
        """A snapshot of the first `length` tokens and their full blocks' hashes."""
        return Prefix(list(self.tokens[:length]), list(self.hashes[: length // block_size]), self.salt)


EMPTY = Prefix((), ())


@dataclass
class Slot:
    index: int
    held: Prefix = EMPTY  # while free: the prefix whose K/V the rows hold
    last_used: int = 0  # LRU clock: when it was last released
    owner: str | None = None  # the request that owns (or reserved) it

    @property
    def tokens(self) -> Sequence[int]:
        return self.held.tokens


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


@dataclass(frozen=True)
class StoredBlock:
    """A full block the cache can now serve: its hash, its parent's (None for a first block), its tokens."""

    hash: bytes
    parent: bytes | None
    token_ids: list[int]
    salt: str | None = None  # the cache salt in a first block's hash


@dataclass
class Changes:
    """Blocks that came and went since the last take_changes; cleared: everything went first (a reset)."""

    stored: list[StoredBlock] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)
    cleared: bool = False


@dataclass
class _Owned:
    slot: Slot
    prefix: Prefix  # its tokens: what its rows come to hold
    committed: int  # tokens its successful steps wrote (from position 0)
    pending: Claim | None = None  # a claim with a copy, until its first step commits

    @property
    def held(self) -> int:
        """Rows a later claim may copy: what the pending copy brings, else what was committed."""
        return self.pending.hit if self.pending else self.committed

    @property
    def source(self) -> int:
        return self.pending.source if self.pending else self.slot.index


class SlotExhaustedError(RuntimeError):
    """vLLM scheduled more requests than there are cache rows (a plugin or configuration bug)."""


def common_length(cached: Sequence[int], token_ids: Sequence[int], start: int, stop: int) -> int:
    """How far from `start` (below `stop`) cached and token_ids agree, counted from position 0."""
    stop = min(stop, len(cached), len(token_ids))
    position = start
    while position < stop and cached[position] == token_ids[position]:
        position += 1
    return position


class BlockIndex:
    """The slots holding each block hash, each slot's indexed hashes (a chain from block 0), and what changed."""

    def __init__(self, batch_size: int, track: bool) -> None:
        self.track = track
        self.holders: dict[bytes, set[int]] = {}
        self.positions: dict[bytes, int] = {}  # a held hash's block number (a chained hash has one place)
        self.chains: list[list[bytes]] = [[] for _ in range(batch_size)]
        self.was_held: dict[bytes, bool] = {}  # hashes that changed since the last take: held before the first change

    def resize(self, slot: int, hashes: Sequence[bytes], blocks: int) -> None:
        """Index the first `blocks` of hashes for slot; its indexed chain must be a prefix of hashes."""
        chain = self.chains[slot]
        while len(chain) > blocks:
            self._drop(slot, chain.pop())
        for block_hash in hashes[len(chain) : blocks]:
            self._note(block_hash)
            self.holders.setdefault(block_hash, set()).add(slot)
            self.positions[block_hash] = len(chain)
            chain.append(block_hash)

    def clear(self, slot: int) -> None:
        self.resize(slot, (), 0)

    def run(self, hashes: Sequence[bytes], blocks: int, usable) -> int:
        """The longest k <= blocks such that a usable slot holds hashes[k - 1] (so hashes[:k]): binary search."""
        low, high = 0, min(blocks, len(hashes))
        while low < high:
            middle = (low + high + 1) // 2
            if any(usable(s) for s in self.holders.get(hashes[middle - 1], ())):
                low = middle
            else:
                high = middle - 1
        return low

    def _drop(self, slot: int, block_hash: bytes) -> None:
        self._note(block_hash)
        holders = self.holders[block_hash]
        holders.discard(slot)
        if not holders:
            del self.holders[block_hash], self.positions[block_hash]

    def _note(self, block_hash: bytes) -> None:
        if self.track:
            self.was_held.setdefault(block_hash, block_hash in self.holders)


class PrefixCache:
    """Which slot each request owns and which prefix each free slot holds.

    enabled False: slots are still assigned here (LRU), every hit is 0. copies: owned slots' prefixes are hits too,
    copied into the claimed slot. block_size: the tokens of one hashed block (vLLM's block size). report: record
    the blocks that come and go for take_changes.
    """

    def __init__(
        self, batch_size: int, enabled: bool, copies: bool = False, block_size: int = 16, report: bool = False
    ) -> None:
        self.slots = [Slot(i) for i in range(batch_size)]
        self.enabled, self.copies = enabled, enabled and copies
        self.block_size = block_size
        self._owned: dict[str, _Owned] = {}
        self._index = BlockIndex(batch_size, track=report)
        self._cleared = False
        self._clock = 0

    def peek(self, prefix: Prefix) -> int:
        """The hit a request would get now (no reservation)."""
        return self._best(prefix).hit if self.num_free else 0

    def claim(self, req_id: str, prefix: Prefix, lookup: bool = True) -> Claim:
        """Reserve the free slot holding the longest prefix of prefix.tokens (the least recently used one
        on a miss). lookup False (e.g. the request skips the prefix cache): the LRU slot, hit 0."""
        if req_id in self._owned:
            self.unclaim(req_id)
        if not self.num_free:
            raise SlotExhaustedError("no free KV cache slot: vLLM scheduled more requests than the compiled batch_size")
        claim = self._best(prefix) if lookup else Claim(self._lru().index, 0)
        slot = self.slots[claim.slot]
        slot.owner = req_id
        owned = _Owned(slot, prefix, committed=claim.hit if claim.source is None else 0)
        owned.pending = claim if claim.source is not None else None
        self._owned[req_id] = owned
        self._index.clear(slot.index)  # the rows past the hit get overwritten; without copies none is a hit
        self._index_owned(owned)
        return claim

    def unclaim(self, req_id: str) -> None:
        """Undo a claim whose request was not admitted: the slot keeps what it held (no copy was made)."""
        slot = self._owned.pop(req_id).slot
        slot.owner = None
        self._index.clear(slot.index)
        self._index_free(slot)

    def commit(self, req_id: str, num_tokens: int) -> None:
        """A step of req_id succeeded: its rows hold K/V of its first num_tokens tokens."""
        owned = self._owned.get(req_id)
        if owned is not None:
            owned.committed, owned.pending = num_tokens, None
            self._index_owned(owned)

    def copy_of(self, req_id: str) -> PrefixCopy | None:
        """The copy req_id's claim carries, before its first step commits."""
        owned = self._owned.get(req_id)
        claim = owned.pending if owned else None
        return None if claim is None else PrefixCopy(req_id, claim.source, claim.slot, claim.hit)

    def release(self, req_id: str) -> int | None:
        """req_id finished or was preempted: its slot is free and holds its committed tokens. Returns the slot."""
        owned = self._owned.pop(req_id, None)
        if owned is None:
            return None
        slot = owned.slot
        slot.held = owned.prefix.head(owned.committed, self.block_size) if self.enabled else EMPTY
        slot.owner = None
        self._clock += 1
        slot.last_used = self._clock
        self._index.clear(slot.index)
        self._index_free(slot)
        return slot.index

    def forget(self) -> None:
        """Free slots hold nothing reusable any more (vLLM's reset_prefix_cache)."""
        for slot in self._free():
            slot.held = EMPTY
            self._index.clear(slot.index)
        if not self._owned:
            self._cleared, self._index.was_held = True, {}

    def take_changes(self) -> Changes:
        """The full blocks the cache can serve as hits that came or went since the last call (parents first)."""
        changes = Changes(cleared=self._cleared)
        stored: list[tuple[int, StoredBlock]] = []
        for block_hash, was_held in self._index.was_held.items():
            holders = self._index.holders.get(block_hash)
            if was_held and not holders:
                changes.removed.append(block_hash)
            elif holders and not was_held:
                stored.append(self._stored_block(block_hash, next(iter(holders))))
        changes.stored = [block for _, block in sorted(stored, key=lambda item: item[0])]
        self._index.was_held, self._cleared = {}, False
        return changes

    def slot_of(self, req_id: str) -> int | None:
        owned = self._owned.get(req_id)
        return None if owned is None else owned.slot.index

    @property
    def num_free(self) -> int:
        return len(self.slots) - len(self._owned)

    def _stored_block(self, block_hash: bytes, slot: int) -> tuple[int, StoredBlock]:
        chain = self._index.chains[slot]
        position = self._index.positions[block_hash]
        block = self._content(self.slots[slot]).tokens[position * self.block_size : (position + 1) * self.block_size]
        if position:
            return position, StoredBlock(block_hash, chain[position - 1], list(block))
        return position, StoredBlock(block_hash, None, list(block), self._content(self.slots[slot]).salt)

    def _content(self, slot: Slot) -> Prefix:
        """What the slot's rows hold (or, for a pending copy, will hold)."""
        if slot.owner is None:
            return slot.held
        return self._owned[slot.owner].prefix  # a pending copy brings the request's own first tokens

    def _index_free(self, slot: Slot) -> None:
        if self.enabled:
            self._index.resize(slot.index, slot.held.hashes, len(slot.held.tokens) // self.block_size)

    def _index_owned(self, owned: _Owned) -> None:
        if self.copies:
            self._index.resize(owned.slot.index, owned.prefix.hashes, owned.held // self.block_size)

    def _free(self) -> list[Slot]:
        return [s for s in self.slots if s.owner is None]

    def _lru(self) -> Slot:
        return min(self._free(), key=lambda s: s.last_used)

    def _best(self, prefix: Prefix) -> Claim:
        if not self.enabled:
            return Claim(self._lru().index, 0)
        # Longest hit; among equal hits the least recently used slot (the others stay for later requests).
        hit, _, index = max((hit, -self.slots[i].last_used, i) for i, hit in self._hits(prefix, self._is_free))
        held, source = self._best_owned(prefix) if self.copies else (0, None)
        return Claim(index, held, source) if held > hit else Claim(index, hit)

    def _best_owned(self, prefix: Prefix) -> tuple[int, int | None]:
        """The longest hit in an owned slot's committed prefix, and the slot to copy it from: the slot itself, or
        for a claim whose copy has not run yet, that copy's source (its rows are what the copy will bring)."""
        best = (0, None)
        for index, hit in self._hits(prefix, self._is_owned):
            if hit > best[0]:
                best = (hit, self._owned[self.slots[index].owner].source)
        return best

    def _hits(self, prefix: Prefix, usable) -> list[tuple[int, int]]:
        """(slot, hit) for the usable slots that could hold the longest hit: those holding the longest run of the
        prefix's full blocks (every usable slot when none holds its first block), extended token by token."""
        limit = len(prefix.tokens) - 1  # the last token is always prefilled
        blocks = self._index.run(prefix.hashes, max(limit, 0) // self.block_size, usable)
        if blocks:
            candidates = [i for i in self._index.holders[prefix.hashes[blocks - 1]] if usable(i)]
        else:
            candidates = [s.index for s in self.slots if usable(s.index)]
        start, stop = blocks * self.block_size, min(limit, (blocks + 1) * self.block_size)
        hits = []
        for index in candidates:
            held = self._held_by(index)
            same = blocks or held.salt == prefix.salt  # the salt is in every hash; compare it for a first block
            hits.append((index, common_length(held.tokens, prefix.tokens, start, stop) if same else 0))
        return hits

    def _held_by(self, index: int) -> Prefix:
        """The tokens a hit may use in a slot: a free slot's prefix, an owned slot's held (committed or copied)."""
        slot = self.slots[index]
        if slot.owner is None:
            return slot.held
        owned = self._owned[slot.owner]
        return Prefix(_Head(owned.prefix.tokens, owned.held), owned.prefix.hashes, owned.prefix.salt)

    def _is_free(self, index: int) -> bool:
        return self.slots[index].owner is None

    def _is_owned(self, index: int) -> bool:
        return self.slots[index].owner is not None


class _Head(Sequence[int]):
    """The first `length` items of a sequence, without copying it."""

    def __init__(self, items: Sequence[int], length: int) -> None:
        self._items, self._length = items, min(length, len(items))

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, position):
        if isinstance(position, slice):
            return self._items[: self._length][position]
        if position >= self._length:
            raise IndexError(position)
        return self._items[position]
