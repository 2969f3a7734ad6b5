"""PrefixCache (prefix_cache.py), the scheduler's slot bookkeeping: token-exact hits, LRU reuse, and a slot never
claiming more than its owner's successful steps wrote."""

from __future__ import annotations

from optimum_neuron_plugin.vllm.prefix_cache import PrefixCache, prefix_hit


def test_a_hit_is_the_common_prefix_and_leaves_the_last_token():
    cached = list(range(20))
    assert prefix_hit(cached, list(range(11)) + [99, 98]) == 11  # diverges at 11
    assert prefix_hit(cached, list(range(12)) + [99]) == 12
    assert prefix_hit(cached, list(range(12))) == 11  # an exact resend prefills its last token
    assert prefix_hit(cached[:7], list(range(30))) == 7  # only what the slot holds
    assert prefix_hit([], list(range(30))) == 0


def test_a_request_goes_into_the_free_slot_holding_its_longest_prefix():
    cache = PrefixCache(batch_size=3, enabled=True)
    for req_id, tokens in (("a", [1] * 9), ("b", [1] * 5), ("c", [2] * 9)):
        cache.claim(req_id, tokens)
        cache.commit(req_id, len(tokens))
    slots = {req_id: cache.slot_of(req_id) for req_id in "abc"}
    for req_id, tokens in (("a", [1] * 9), ("b", [1] * 5), ("c", [2] * 9)):
        cache.release(req_id, tokens)
    claim = cache.claim("d", [1] * 12)
    assert (claim.slot, claim.hit) == (slots["a"], 9)
    assert cache.claim("e", [3] * 12).hit == 0
    assert cache.num_free == 1


def test_a_miss_takes_the_least_recently_used_slot():
    cache = PrefixCache(batch_size=2, enabled=True)
    for req_id in ("old", "new"):
        cache.claim(req_id, [ord(req_id[0])] * 8)
        cache.commit(req_id, 8)
    cache.release("old", [ord("o")] * 8)
    cache.release("new", [ord("n")] * 8)
    assert cache.claim("x", [7] * 8).hit == 0
    assert cache.claim("y", [ord("n")] * 9).hit == 8  # the recent prefix survived


def test_a_slot_holds_only_what_committed_steps_wrote():
    cache = PrefixCache(batch_size=1, enabled=True)
    prompt = list(range(16))
    cache.claim("a", prompt)
    cache.commit("a", 7)  # one successful step; the next one failed or was aborted: never committed
    cache.release("a", prompt)
    assert cache.claim("b", prompt).hit == 7


def test_an_unclaimed_slot_keeps_its_prefix_and_disabled_caching_never_hits():
    cache = PrefixCache(batch_size=1, enabled=True)
    cache.claim("a", [5] * 9)
    cache.commit("a", 9)
    cache.release("a", [5] * 9)
    cache.claim("b", [5] * 9)
    cache.unclaim("b")  # not admitted this step
    assert cache.claim("c", [5] * 9).hit == 8
    off = PrefixCache(batch_size=1, enabled=False)
    off.claim("a", [5] * 9)
    off.commit("a", 9)
    off.release("a", [5] * 9)
    assert off.claim("b", [5] * 9).hit == 0


def held_in(cache: PrefixCache, req_id: str, tokens: list[int], written: int) -> None:
    """req_id is admitted and one step of it succeeds, writing its first `written` tokens."""
    cache.claim(req_id, tokens)
    cache.commit(req_id, written)


def test_a_prefix_in_an_owned_slot_is_copied_into_the_best_free_slot():
    cache = PrefixCache(batch_size=3, enabled=True, copies=True)
    system = list(range(20))
    held_in(cache, "old", [9] * 4, 4)
    cache.release("old", [9] * 4)
    held_in(cache, "running", system + [1, 2], 22)  # owns a slot, has written its prompt
    claim = cache.claim("new", system + [3, 4])
    assert (claim.hit, claim.source) == (20, cache.slot_of("running"))
    assert claim.slot not in (cache.slot_of("running"), None)
    copy = cache.copy_of("new")
    assert (copy.source, copy.destination, copy.length) == (claim.source, claim.slot, 20)
    # A running request holds only what it committed: an admitted one that has not run yet holds its hit.
    assert PrefixCache(2, True, copies=True).claim("x", system).source is None


def test_a_tie_prefers_the_free_slot_and_without_copies_an_owned_prefix_is_a_miss():
    system = list(range(20))
    for copies in (True, False):
        cache = PrefixCache(batch_size=3, enabled=True, copies=copies)
        held_in(cache, "running", system[:12] + [7], 13)
        cache.claim("free", system[:12], lookup=False)  # the same 12 tokens, in a slot of its own
        cache.commit("free", 12)
        free = cache.release("free", system[:12])
        claim = cache.claim("new", system)
        assert (claim.slot, claim.hit, claim.source) == (free, 12, None)
    off = PrefixCache(batch_size=2, enabled=True, copies=False)
    held_in(off, "running", system, 20)
    assert (off.claim("new", system + [1]).hit, off.copy_of("new")) == (0, None)


def test_a_copy_commits_nothing_until_its_step_succeeds_and_later_claims_copy_from_its_source():
    cache = PrefixCache(batch_size=4, enabled=True, copies=True)
    system = list(range(30))
    held_in(cache, "running", system + [1], 31)
    source = cache.slot_of("running")
    first = cache.claim("a", system + [2])
    # Same step: "a"'s slot gets the prefix only when the copy runs; "b" copies from the same source.
    second = cache.claim("b", system + [3])
    assert first.source == second.source == source and second.hit == 30
    cache.release("a", system + [2])  # its copy or first step failed: its slot holds nothing known
    assert cache.slots[first.slot].tokens == []
    cache.commit("b", 33)  # b's first step succeeded: its rows are its own now
    assert cache.copy_of("b") is None
    cache.unclaim("running")
    claim = cache.claim("c", system + [4])
    assert (claim.source, claim.hit) == (second.slot, 30)


def test_an_unclaimed_copy_is_not_made():
    cache = PrefixCache(batch_size=2, enabled=True, copies=True)
    held_in(cache, "running", list(range(10)), 10)
    claim = cache.claim("new", list(range(12)))
    assert claim.source is not None
    cache.unclaim("new")  # not admitted this step
    assert cache.copy_of("new") is None and cache.num_free == 1
