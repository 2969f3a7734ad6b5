"""Prefix caching (on by default) is vLLM's own: a request whose first full KV blocks are cached (written by an
earlier request, finished or still running, or by one of the same step) shares them and prefills the rest from the
first position after them; it generates exactly what transformers (and an engine without the cache) generates.
A hit is whole blocks (the artifact's block_size), never the prompt's last token.

cached_tokens below is vLLM's RequestOutput.num_cached_tokens (what usage.prompt_tokens_details.cached_tokens
reports); the runner's own record (ONP_STATS_FILE) says where each request's first prefill call started.
"""

from __future__ import annotations

import json

import pytest
from support.engine import close_llm, make_llm
from support.references import hf_greedy
from support.served import BATCH_SIZE, CHUNK, prompt_of

from optimum_neuron_plugin.artifact import load_neuron_config

pytestmark = pytest.mark.slow  # an in-process vLLM engine

NEW_TOKENS = 6
SERIAL = {"prefill_mode": "serial"}


def greedy(max_tokens: int = NEW_TOKENS, **kwargs):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kwargs)


class Engine:
    """An in-process engine, its runner's stats file, and vLLM's cached_tokens of every request it served."""

    def __init__(self, artifact, stats_file, **kwargs) -> None:
        self.stats_file = stats_file
        self.block_size = load_neuron_config(str(artifact)).block_size
        self.cached: dict[str, int] = {}  # vLLM's request id -> num_cached_tokens
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ONP_STATS_FILE", str(stats_file))
            self.llm = make_llm(artifact, **kwargs)

    def generate(self, prompts: list[list[int]], params=None):
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params or greedy(), use_tqdm=False)
        self.cached.update({o.request_id: o.num_cached_tokens for o in outputs})
        return outputs

    def runner_hits(self) -> dict[str, int]:
        """The runner's cached_tokens (where its first prefill call started) by vLLM's request id.

        The runner writes a request's record when the next step tells it the request finished.
        """
        return {req_id: r["cached_tokens"] for req_id, r in self.runner_records().items()}

    def runner_records(self) -> dict[str, dict]:
        records = [json.loads(line) for line in self.stats_file.read_text().splitlines()]
        return {r["req_id"].split("-")[0]: r for r in records}

    def run(self, requests: dict[str, list[int]], params=None, steps_before: int = 0) -> dict[str, object]:
        """The first request, then `steps_before` engine steps, then the others at once, all to the end; the final
        outputs by request id (ids without a dash)."""
        engine, (first, *others) = self.llm.llm_engine, requests.items()
        engine.add_request(first[0], {"prompt_token_ids": first[1]}, params or greedy())
        for _ in range(steps_before):
            engine.step()
        for req_id, prompt in others:
            engine.add_request(req_id, {"prompt_token_ids": prompt}, params or greedy())
        finished = {}
        while engine.has_unfinished_requests():
            finished.update({o.request_id: o for o in engine.step() if o.finished})
        return finished

    def full_blocks(self, tokens: int) -> int:
        """The tokens of the whole blocks among the first `tokens`: what a hit on them reuses."""
        return tokens // self.block_size * self.block_size

    def close(self) -> None:
        close_llm(self.llm)


@pytest.fixture(scope="module")
def engine(chunked_dir, vllm_root):
    # The serial prefill mode: a step admits the requests that arrive together and prefills each whole.
    served = Engine(chunked_dir, vllm_root / "prefix-caching-stats.jsonl", additional_config=SERIAL)
    yield served
    served.close()


def tokens(output) -> list[int]:
    return list(output.outputs[0].token_ids)


def other_prompts(tokenizer, count: int, length: int = 3 * CHUNK) -> list[list[int]]:
    """Prompts that share no first token with prompt_of(n, tokenizer, offset=0)."""
    return [prompt_of(length, tokenizer, offset=5 + i) for i in range(count)]


def test_a_resent_prefix_reuses_its_full_blocks(engine, tokenizer, tiny_hf):
    first = prompt_of(4 * CHUNK + 6, tokenizer)
    (out,) = engine.generate([first])
    assert out.num_cached_tokens == 0
    longer = first + prompt_of(9, tokenizer, offset=3)
    assert longer[len(first)] != tokens(out)[0]
    (out,) = engine.generate([longer])
    # The first prompt's full blocks are reused; the rest of its last block and the new tokens are prefilled.
    assert out.num_cached_tokens == engine.full_blocks(len(first)) > 0
    assert tokens(out) == hf_greedy(tiny_hf, longer, NEW_TOKENS)


@pytest.mark.parametrize("served", ["engine", "interleaved"])
def test_a_wave_sharing_a_held_prefix_reuses_its_blocks(served, request, tokenizer, tiny_hf):
    """A finished request left a system prompt in the cache; a wave of BATCH_SIZE requests sharing it arrives in one
    step: every one shares its full blocks."""
    served = request.getfixturevalue(served)
    system = prompt_of(4 * CHUNK + 5, tokenizer, offset=17)
    served.generate([system + prompt_of(6, tokenizer, offset=5)])
    prompts = {f"wave{i}": system + prompt_of(8 + i, tokenizer, offset=8 + i) for i in range(BATCH_SIZE)}
    outputs = served.run(prompts)
    assert [outputs[r].num_cached_tokens for r in prompts] == [served.full_blocks(len(system))] * BATCH_SIZE
    assert [tokens(outputs[r]) for r in prompts] == [hf_greedy(tiny_hf, p, NEW_TOKENS) for p in prompts.values()]


def test_requests_arriving_while_the_holder_runs_share_its_blocks(engine, tokenizer, tiny_hf):
    """The prefix is held only by a request still decoding (no finished request ever held it)."""
    system = prompt_of(5 * CHUNK + 3, tokenizer, offset=19)[::-1]  # reversed: no earlier prompt starts with it
    prompts = {"holder": system + prompt_of(5, tokenizer, offset=2)}
    prompts |= {f"late{i}": system + prompt_of(7 + i, tokenizer, offset=30 + i) for i in range(BATCH_SIZE - 1)}
    outputs = engine.run(prompts, greedy(12), steps_before=3)  # the holder prefilled and decoding
    hits = [outputs[r].num_cached_tokens for r in prompts]
    assert hits == [0] + [engine.full_blocks(len(system))] * (BATCH_SIZE - 1)
    assert [tokens(outputs[r]) for r in prompts] == [hf_greedy(tiny_hf, p, 12) for p in prompts.values()]


def test_an_exact_resend_prefills_its_last_block(engine, tokenizer, tiny_hf):
    prompt = prompt_of(4 * CHUNK, tokenizer, offset=1)
    engine.generate([prompt])
    (out,) = engine.generate([prompt])
    # The last token must be prefilled for the first token's logits: the block holding it is computed again.
    assert out.num_cached_tokens == engine.full_blocks(len(prompt) - 1)
    assert tokens(out) == hf_greedy(tiny_hf, prompt, NEW_TOKENS)


def test_a_prompt_diverging_mid_block_reuses_the_blocks_before(engine, tokenizer, tiny_hf):
    base = prompt_of(5 * CHUNK, tokenizer, offset=2)
    engine.generate([base])
    diverging = base[: 2 * CHUNK + 7] + prompt_of(30, tokenizer, offset=11)
    assert diverging[2 * CHUNK + 7] != base[2 * CHUNK + 7]
    (out,) = engine.generate([diverging])
    assert out.num_cached_tokens == engine.full_blocks(2 * CHUNK + 7) > 0
    assert tokens(out) == hf_greedy(tiny_hf, diverging, NEW_TOKENS)


def test_a_prefix_whose_blocks_were_reused_is_a_miss(engine, tokenizer, tiny_hf):
    prompt = prompt_of(3 * CHUNK + 3, tokenizer, offset=4)
    engine.generate([prompt])
    # Other prompts allocating more blocks than the pool has: the least recently used ones, the prompt's among them,
    # are taken for them.
    others = [prompt_of(3 * CHUNK, tokenizer, offset=i)[::-1] for i in range(4 * BATCH_SIZE)]
    assert all(p[0] != prompt[0] for p in others)
    engine.generate(others)
    (out,) = engine.generate([prompt])
    assert out.num_cached_tokens == 0
    assert tokens(out) == hf_greedy(tiny_hf, prompt, NEW_TOKENS)


def test_a_system_prompt_shared_by_requests_of_the_same_step(engine, tokenizer, tiny_hf):
    """No request held the system prompt: the first of the step writes its blocks, the others of the same step share
    them (their prefills run after its own) and so do the next ones."""
    system = prompt_of(3 * CHUNK + 5, tokenizer, offset=13)[::-1]  # reversed: no earlier prompt starts with it
    prompts = [system + prompt_of(10, tokenizer, offset=i) for i in range(2 * BATCH_SIZE)]
    outputs = engine.generate(prompts)
    assert [tokens(o) for o in outputs] == [hf_greedy(tiny_hf, p, NEW_TOKENS) for p in prompts]
    hit = engine.full_blocks(len(system))
    assert sorted(o.num_cached_tokens for o in outputs) == [0] + [hit] * (2 * BATCH_SIZE - 1)


def test_the_turns_of_a_conversation_reuse_the_history(engine, tokenizer, tiny_hf):
    history = prompt_of(2 * CHUNK + 9, tokenizer, offset=15)
    computed = 0  # tokens whose K/V the previous turn computed
    for turn in range(3):
        (out,) = engine.generate([history])
        assert tokens(out) == hf_greedy(tiny_hf, history, NEW_TOKENS)
        # The previous turn's prompt and the outputs it fed back (all but its last token): their full blocks.
        assert out.num_cached_tokens == engine.full_blocks(computed)
        computed = len(history) + NEW_TOKENS - 1
        history = history + tokens(out) + prompt_of(7, tokenizer, offset=turn)


def test_a_seeded_sampled_request_samples_the_same_with_a_hit(engine, chunked_dir, vllm_root, tokenizer):
    from vllm import SamplingParams

    prompt = prompt_of(3 * CHUNK + 5, tokenizer, offset=6)
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    engine.generate([prompt])
    (hit,) = engine.generate([prompt], params)
    assert hit.num_cached_tokens == engine.full_blocks(len(prompt) - 1) > 0
    fresh = Engine(chunked_dir, vllm_root / "prefix-caching-off.jsonl", enable_prefix_caching=False)
    try:
        fresh.generate([prompt])
        (miss,) = fresh.generate([prompt], params)
    finally:
        fresh.close()
    assert miss.num_cached_tokens == 0
    assert set(fresh.runner_hits().values()) == {0}
    assert tokens(hit) == tokens(miss)


@pytest.fixture(scope="module")
def interleaved(chunked_dir, vllm_root):
    # A fixed budget of two chunk calls per step: the latency target's budget follows the host's measured speed.
    served = Engine(
        chunked_dir,
        vllm_root / "prefix-interleaved.jsonl",
        additional_config={"prefill_mode": "interleaved", "prefill_chunk_budget": 2},
    )
    yield served
    served.close()


def test_an_aborted_prefill_is_a_hit_only_for_what_it_wrote(interleaved, tokenizer, tiny_hf):
    from vllm.sampling_params import RequestOutputKind

    engine = interleaved.llm.llm_engine
    prompt = prompt_of(6 * CHUNK + 4, tokenizer, offset=3)
    engine.add_request("aborted", {"prompt_token_ids": prompt}, greedy(output_kind=RequestOutputKind.DELTA))
    engine.step()  # the first slice: two chunk calls (the fixture's budget per step)
    engine.abort_request(["aborted"])
    while engine.has_unfinished_requests():
        engine.step()
    (out,) = interleaved.generate([prompt])
    assert out.num_cached_tokens == 2 * CHUNK
    assert tokens(out) == hf_greedy(tiny_hf, prompt, NEW_TOKENS)


def test_a_hit_prefills_next_to_decoding_requests(interleaved, tokenizer, tiny_hf):
    """Interleaved slices from the hit on, one of them riding in a chunk_and_decode call with the decodes."""
    system = prompt_of(2 * CHUNK + 3, tokenizer, offset=9)
    prompts = [system + prompt_of(3 * CHUNK + i, tokenizer, offset=i) for i in range(2 * BATCH_SIZE + 1)]
    outputs = interleaved.generate(prompts, greedy(12))
    assert [tokens(o) for o in outputs] == [hf_greedy(tiny_hf, p, 12) for p in prompts]
    assert sum(o.num_cached_tokens == interleaved.full_blocks(len(system)) for o in outputs) >= BATCH_SIZE


def test_hits_prefilled_together(batched_dir, vllm_root, tokenizer, tiny_hf):
    """prefill_batch_size > 1: the prompts of a step start their chunk loops at their own hits in one call."""
    served = Engine(batched_dir, vllm_root / "prefix-batched.jsonl", additional_config=SERIAL)
    try:
        system = prompt_of(3 * CHUNK + 9, tokenizer, offset=13)
        served.generate([system + prompt_of(4, tokenizer, offset=12)])  # leaves the system prompt in the cache
        prompts = [system + prompt_of(20 + i, tokenizer, offset=i) for i in range(2 * BATCH_SIZE)]
        outputs = served.generate(prompts)
        served.generate([prompt_of(2, tokenizer)], greedy(1))  # the runner records the previous requests' stats
    finally:
        served.close()
    assert [tokens(o) for o in outputs] == [hf_greedy(tiny_hf, p, NEW_TOKENS) for p in prompts]
    records = [json.loads(line) for line in served.stats_file.read_text().splitlines()]
    hits = [r for r in records if r["cached_tokens"] == served.full_blocks(len(system))]
    assert len(hits) == 2 * BATCH_SIZE and all(r["batched"] for r in hits), records


def test_vllm_reports_exactly_the_hits_the_runner_used(engine, tokenizer):
    """Every request of this module: vLLM's cached_tokens equals where the runner started prefilling it."""
    engine.generate([prompt_of(2, tokenizer)], greedy(1))  # the runner records the previous requests' stats
    runner = engine.runner_hits()
    served = {req_id: hit for req_id, hit in engine.cached.items() if req_id in runner}
    assert len(served) == len(engine.cached) - 1
    assert served == {req_id: runner[req_id] for req_id in served}
    assert sum(served.values()) > 0
