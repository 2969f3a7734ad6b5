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
