"""PrefixCache (prefix_cache.py), the scheduler's slot bookkeeping: token-exact hits found by vLLM's chained block
hashes, LRU reuse, a slot never claiming more than its owner's successful steps wrote, and the blocks it reports as
stored and removed (the KV-cache events)."""

from __future__ import annotations

import random

from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash

from optimum_neuron_plugin.vllm.scheduler.prefix_cache import Prefix, PrefixCache

BLOCK = 4
init_none_hash(sha256)


def P(tokens: list[int], salt: str | None = None) -> Prefix:  # noqa: N802
    """tokens with vLLM's chained sha256 hashes of their full BLOCK-token blocks (the salt keys the first block)."""
    hashes, parent = [], None
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        extra = (salt,) if salt is not None and start == 0 else None
        parent = hash_block_tokens(sha256, parent, tokens[start : start + BLOCK], extra)
        hashes.append(parent)
    return Prefix(tokens, hashes, salt)


def test_a_hit_is_the_common_prefix_and_leaves_the_last_token():
    cached = list(range(20))
    for tokens, hit in (
        (list(range(11)) + [99, 98], 11),  # diverges at 11, inside the third block
        (list(range(12)) + [99], 12),  # diverges at a block boundary
        (list(range(12)), 11),  # an exact resend prefills its last token
        (list(range(30)), 20),  # only what the slot holds
        ([1] + list(range(1, 30)), 0),  # differs in the first token
    ):
        cache = PrefixCache(batch_size=1, enabled=True, block_size=BLOCK)
        cache.claim("a", P(cached))
        cache.commit("a", len(cached))
        cache.release("a")
        assert cache.claim("b", P(tokens)).hit == hit, tokens


def test_a_salted_prefix_hits_only_the_same_salt():
    cache = PrefixCache(batch_size=1, enabled=True, block_size=BLOCK)
    cache.claim("a", P(list(range(10)), salt="alice"))
    cache.commit("a", 10)
    cache.release("a")
    for tokens in (list(range(12)), [0, 1, 7]):  # past a full block, and inside the first one
        assert cache.peek(P(tokens, salt="bob")) == cache.peek(P(tokens)) == 0
        assert cache.peek(P(tokens, salt="alice")) == min(10, len(tokens) - 1, 2 if tokens[2] == 7 else 99)


def test_a_request_goes_into_the_free_slot_holding_its_longest_prefix():
    cache = PrefixCache(batch_size=3, enabled=True, block_size=BLOCK)
    for req_id, tokens in (("a", [1] * 9), ("b", [1] * 5), ("c", [2] * 9)):
        cache.claim(req_id, P(tokens))
        cache.commit(req_id, len(tokens))
    slots = {req_id: cache.slot_of(req_id) for req_id in "abc"}
    for req_id in "abc":
        cache.release(req_id)
    claim = cache.claim("d", P([1] * 12))
    assert (claim.slot, claim.hit) == (slots["a"], 9)
    assert cache.claim("e", P([3] * 12)).hit == 0
    assert cache.num_free == 1


def test_a_miss_takes_the_least_recently_used_slot():
    cache = PrefixCache(batch_size=2, enabled=True, block_size=BLOCK)
    for req_id in ("old", "new"):
        cache.claim(req_id, P([ord(req_id[0])] * 8))
        cache.commit(req_id, 8)
    cache.release("old")
    cache.release("new")
    assert cache.claim("x", P([7] * 8)).hit == 0
    assert cache.claim("y", P([ord("n")] * 9)).hit == 8  # the recent prefix survived


def test_a_slot_holds_only_what_committed_steps_wrote():
    cache = PrefixCache(batch_size=1, enabled=True, block_size=BLOCK)
    prompt = list(range(16))
    cache.claim("a", P(prompt))
    cache.commit("a", 7)  # one successful step; the next one failed or was aborted: never committed
    cache.release("a")
    assert cache.claim("b", P(prompt)).hit == 7


def test_an_unclaimed_slot_keeps_its_prefix_and_disabled_caching_never_hits():
    cache = PrefixCache(batch_size=1, enabled=True, block_size=BLOCK)
    cache.claim("a", P([5] * 9))
    cache.commit("a", 9)
    cache.release("a")
    cache.claim("b", P([5] * 9))
    cache.unclaim("b")  # not admitted this step
    assert cache.claim("c", P([5] * 9)).hit == 8
    off = PrefixCache(batch_size=1, enabled=False, block_size=BLOCK)
    off.claim("a", P([5] * 9))
    off.commit("a", 9)
    off.release("a")
    assert off.claim("b", P([5] * 9)).hit == 0


def held_in(cache: PrefixCache, req_id: str, tokens: list[int], written: int) -> None:
    """req_id is admitted and one step of it succeeds, writing its first `written` tokens."""
    cache.claim(req_id, P(tokens))
    cache.commit(req_id, written)


def test_a_prefix_in_an_owned_slot_is_copied_into_the_best_free_slot():
    cache = PrefixCache(batch_size=3, enabled=True, copies=True, block_size=BLOCK)
    system = list(range(20))
    held_in(cache, "old", [9] * 4, 4)
    cache.release("old")
    held_in(cache, "running", system + [1, 2], 22)  # owns a slot, has written its prompt
    claim = cache.claim("new", P(system + [3, 4]))
    assert (claim.hit, claim.source) == (20, cache.slot_of("running"))
    assert claim.slot not in (cache.slot_of("running"), None)
    copy = cache.copy_of("new")
    assert (copy.source, copy.destination, copy.length) == (claim.source, claim.slot, 20)
    # A running request holds only what it committed: an admitted one that has not run yet holds its hit.
    assert PrefixCache(2, True, copies=True, block_size=BLOCK).claim("x", P(system)).source is None


def test_a_tie_prefers_the_free_slot_and_without_copies_an_owned_prefix_is_a_miss():
    system = list(range(20))
    for copies in (True, False):
        cache = PrefixCache(batch_size=3, enabled=True, copies=copies, block_size=BLOCK)
        held_in(cache, "running", system[:12] + [7], 13)
        cache.claim("free", P(system[:12]), lookup=False)  # the same 12 tokens, in a slot of its own
        cache.commit("free", 12)
        free = cache.release("free")
        claim = cache.claim("new", P(system))
        assert (claim.slot, claim.hit, claim.source) == (free, 12, None)
    off = PrefixCache(batch_size=2, enabled=True, copies=False, block_size=BLOCK)
    held_in(off, "running", system, 20)
    assert (off.claim("new", P(system + [1])).hit, off.copy_of("new")) == (0, None)


def test_a_copy_commits_nothing_until_its_step_succeeds_and_later_claims_copy_from_its_source():
    cache = PrefixCache(batch_size=4, enabled=True, copies=True, block_size=BLOCK)
    system = list(range(30))
    held_in(cache, "running", system + [1], 31)
    source = cache.slot_of("running")
    first = cache.claim("a", P(system + [2]))
    # Same step: "a"'s slot gets the prefix only when the copy runs; "b" copies from the same source.
    second = cache.claim("b", P(system + [3]))
    assert first.source == second.source == source and second.hit == 30
    cache.release("a")  # its copy or first step failed: its slot holds nothing known
    assert not cache.slots[first.slot].tokens
    cache.commit("b", 33)  # b's first step succeeded: its rows are its own now
    assert cache.copy_of("b") is None
    cache.unclaim("running")
    claim = cache.claim("c", P(system + [4]))
    assert (claim.source, claim.hit) == (second.slot, 30)


def test_an_unclaimed_copy_is_not_made():
    cache = PrefixCache(batch_size=2, enabled=True, copies=True, block_size=BLOCK)
    held_in(cache, "running", list(range(10)), 10)
    claim = cache.claim("new", P(list(range(12))))
    assert claim.source is not None
    cache.unclaim("new")  # not admitted this step
    assert cache.copy_of("new") is None and cache.num_free == 1


def scanned_hit(tokens: list[int], held: list[list[int]]) -> int:
    """The longest token-by-token common prefix with any of `held`, leaving the last token."""
    best = 0
    for cached in held:
        common = 0
        while common < min(len(cached), len(tokens) - 1) and cached[common] == tokens[common]:
            common += 1
        best = max(best, common)
    return best


def test_the_block_hash_lookup_finds_the_hit_a_token_by_token_scan_finds():
    rng = random.Random(0)
    for copies in (False, True):
        cache = PrefixCache(batch_size=4, enabled=True, copies=copies, block_size=BLOCK)
        written: dict[str, list[int]] = {}  # owner -> the tokens its steps committed
        free: dict[int, list[int]] = {}  # slot -> the tokens it holds
        for step in range(400):
            if written and (cache.num_free == 0 or rng.random() < 0.4):
                req_id = rng.choice(sorted(written))
                slot = cache.release(req_id)
                free[slot] = written.pop(req_id)
                continue
            # Few distinct tokens: many shared prefixes, splits inside blocks and at their boundaries.
            tokens = [rng.choice((1, 2)) if rng.random() < 0.9 else 3 for _ in range(rng.randrange(1, 30))]
            owned = list(written.values()) if copies else []
            expected = scanned_hit(tokens, [free.get(s.index, []) for s in cache.slots if s.owner is None] + owned)
            req_id = f"r{step}"
            claim = cache.claim(req_id, P(tokens))
            assert claim.hit == expected, (step, tokens)
            done = rng.randrange(claim.hit, len(tokens) + 1)
            cache.commit(req_id, done)
            written[req_id] = tokens[:done]
            free.pop(claim.slot, None)


def test_blocks_are_reported_stored_when_held_and_removed_when_overwritten():
    cache = PrefixCache(batch_size=1, enabled=True, block_size=BLOCK, report=True)
    first = P(list(range(10)))
    cache.claim("a", first)
    cache.commit("a", 10)
    assert cache.take_changes().stored == []  # an owned slot's blocks are no hit without copies
    cache.release("a")
    stored = cache.take_changes().stored
    assert [b.hash for b in stored] == list(first.hashes)  # two full blocks; the partial third is not reported
    assert [b.parent for b in stored] == [None, first.hashes[0]]
    assert [b.token_ids for b in stored] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    cache.claim("b", P([0, 1, 2, 3, 4, 9, 9, 9, 9]))  # hit 5: the slot's second block gets overwritten
    changes = cache.take_changes()
    assert sorted(changes.removed) == sorted(first.hashes) and changes.stored == []  # owned now: none is a hit
    cache.commit("b", 9)
    cache.release("b")
    assert [b.token_ids for b in cache.take_changes().stored] == [[0, 1, 2, 3], [4, 9, 9, 9]]
    cache.forget()
    assert cache.take_changes().cleared and cache.peek(first) == 0
    cache.claim("c", first)
    cache.unclaim("c")  # claimed and undone before the changes were taken: nothing changed
    assert cache.take_changes() == type(changes)()
