"""Speculative decoding (n-gram prompt lookup) through an in-process vllm.LLM: the served tokens are the tokens
greedy decoding without drafts gives (transformers), whatever the drafts' fate, and stopping inside an accepted
run; vLLM's prefix cache holds only blocks whose K/V are their tokens' (never a rejected draft's); options it cannot
serve are refused.

One artifact: the served tiny Llama (chunk 16, on-device sampling) with verify graphs of K drafts. Per-request
draft and acceptance counts come from the runner's stats file (ONP_STATS_FILE).
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from support.engine import close_llm, make_llm
from support.references import hf_greedy
from support.served import SEQUENCE_LENGTH, SPECULATIVE_TOKENS, prompt_of

from optimum_neuron_plugin.graphs import TOKEN_GENERATION, VERIFY
from optimum_neuron_plugin.runtime.graph_select import spec_key
from optimum_neuron_plugin.runtime.latency import GraphLatencies
from optimum_neuron_plugin.vllm.spec_decode.draft_gate import MIN_ACCEPTANCE_ENV, DraftGate
from optimum_neuron_plugin.vllm.spec_decode.verify_cost import NextRow, PooledRate, VerifyCosts

pytestmark = pytest.mark.slow  # an in-process vLLM engine

K = SPECULATIVE_TOKENS
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def stats_file(vllm_root):
    return vllm_root / "speculative-stats.jsonl"


@pytest.fixture(scope="module")
def llm(spec_dir, stats_file):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONP_STATS_FILE", str(stats_file))
        # Every request drafts whatever its acceptance: these tests check what verified drafts do (the pause after
        # rejected drafts: test_rejected_drafts_pause_drafting_for_doubling_pauses, and test_speculative_draft.py).
        patch.setenv(MIN_ACCEPTANCE_ENV, "0")
        engine = make_llm(spec_dir, speculative_config=NGRAM, disable_log_stats=False)
    yield engine
    close_llm(engine)


def greedy(max_tokens: int, **kwargs):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kwargs)


def generate(llm, prompts, params):
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], [o.request_id for o in outputs]


def stats(stats_file, request_ids) -> list[dict]:
    """The runner's records of these requests (written when the step after their end tells it they finished)."""
    records = {
        json.loads(line)["req_id"].split("-")[0]: json.loads(line) for line in stats_file.read_text().splitlines()
    }
    return [records[r] for r in request_ids if r in records]


def spec_metrics(llm) -> dict[str, object]:
    """vLLM's spec-decode counters (drafts, draft and accepted tokens, accepted tokens per draft position)."""
    found = {m.name.removeprefix("vllm:spec_decode_"): m for m in llm.get_metrics() if "spec_decode" in m.name}
    return {name: getattr(m, "values", None) or getattr(m, "value", 0) for name, m in found.items()}


def random_prompt(length: int, seed: int) -> list[int]:
    return torch.randint(1000, 40000, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_the_ngram_lookup_runs_on_numbas_workqueue_pool(llm):
    """vLLM's n-gram lookup (a numba parallel loop) ran at startup on numba's workqueue layer: the pool of its
    default OpenMP layer contends with torch's for the cores, making every graph call ~40x slower
    (benchmark/results/20261126-speculative-ngram-k4-vs-plain)."""
    import numba

    assert numba.threading_layer() == "workqueue"


def test_greedy_with_speculation_equals_greedy_without(llm, tokenizer, tiny_hf, stats_file):
    """Repetitive prompts (drafts hit), random ones (drafts from the output only, most rejected), one ending at the
    sequence length: each equals transformers' greedy tokens (the plugin without drafts equals them: test_engine)."""
    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate([40, 23, 61, 9])]
    prompts += [random_prompt(n, seed=n) for n in (30, 50)]
    prompts.append(prompt_of(SEQUENCE_LENGTH - 7, tokenizer, offset=2))  # 6 new tokens fit: ends at the length
    before = spec_metrics(llm)
    served, ids = generate(llm, prompts, greedy(24))
    for prompt, tokens in zip(prompts, served, strict=True):
        expected = min(24, SEQUENCE_LENGTH - len(prompt))
        assert tokens == hf_greedy(tiny_hf, prompt, expected), len(prompt)
    after = spec_metrics(llm)
    earlier = before.get("num_accepted_tokens_per_pos") or [0] * K
    per_position = [a - b for a, b in zip(after["num_accepted_tokens_per_pos"], earlier, strict=True)]
    drafts = after["num_drafts"] - before.get("num_drafts", 0)
    assert per_position[K - 1] > 0, after  # steps where all K drafts were accepted
    assert drafts > per_position[0] > 0, after  # steps where none was
    generate(llm, [prompts[0]], greedy(1))  # a later step writes the runner's records of the requests above
    records = stats(stats_file, ids)
    assert sum(r["accepted_tokens"] for r in records) == after["num_accepted_tokens"] - before.get(
        "num_accepted_tokens", 0
    )


def test_stopping_inside_an_accepted_run(llm, tokenizer, tiny_hf, stats_file):
    """A prompt followed by its own greedy continuation makes the model repeat one token 12 times (outputs 11..22):
    drafts are accepted there, and max_tokens falling on every position of that run cuts it where it must."""
    base = prompt_of(61, tokenizer, offset=2)
    prompt = base + hf_greedy(tiny_hf, base, 24)
    reference = hf_greedy(tiny_hf, prompt, 24)
    assert reference[11:23] == [reference[11]] * 12  # the run (a property of this random model)
    lengths = list(range(13, 24, 2))
    outputs, ids = generate(llm, [prompt] * len(lengths), [greedy(n) for n in lengths])
    assert outputs == [reference[:n] for n in lengths]
    for j in (23,):  # a stop token right after the run
        params = greedy(24, stop_token_ids=[reference[j]])
        params.ignore_eos = False
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
        first = reference.index(reference[j])
        assert list(out.token_ids) == reference[: first + 1] and out.finish_reason == "stop"
    generate(llm, [prompt], greedy(1))
    records = stats(stats_file, ids)
    assert all(r["accepted_tokens"] >= 3 for r in records if r["output_tokens"] >= 16), records


def test_the_prefix_cache_holds_no_rejected_draft(llm, tokenizer, tiny_hf, monkeypatch):
    """After each request, every block of it that vLLM's prefix cache holds (a hashed block) has the K/V transformers
    computes for its tokens: a rejected draft's K/V (left past a request's last token) is never in a cached block. The
    requests end right after a run of accepted drafts, where the last step rejects drafts."""
    base = prompt_of(61, tokenizer, offset=2)
    prompt = base + hf_greedy(tiny_hf, base, 24)
    core = llm.llm_engine.engine_core.engine_core
    serving = runner(llm)
    last: dict[str, tuple[list[int], list[int]]] = {}  # req_id -> (block ids, tokens computed) after its last step
    execute = serving.execute

    def recording(*args, **kwargs):
        output = execute(*args, **kwargs)
        for req_id, state in serving.requests.items():
            last[req_id] = (list(state.block_ids), list(state.all_token_ids[:-1]))  # the last token's K/V: not yet
        return output

    monkeypatch.setattr(serving, "execute", recording)
    pool = core.scheduler.kv_cache_manager.block_pool
    block, checked = serving.block_size, 0
    for max_tokens in (23, 24, 25, 26):
        last.clear()
        generate(llm, [prompt], greedy(max_tokens))
        ((block_ids, computed),) = last.values()
        for index, block_id in enumerate(block_ids[: len(computed) // block]):
            if pool.blocks[block_id].block_hash is not None:
                check_block(serving.model.caches, block_id, computed[: (index + 1) * block], block, tiny_hf)
                checked += 1
    assert checked > 0


def check_block(caches, block_id: int, tokens: list[int], block: int, hf) -> None:
    """Block block_id holds the K/V of the last `block` of tokens (positions len(tokens) - block ...)."""
    with torch.no_grad():
        cache = hf(torch.tensor([tokens]), use_cache=True).past_key_values
    for layer in range(hf.config.num_hidden_layers):
        keys, values = cache.layers[layer].keys[0, :, -block:], cache.layers[layer].values[0, :, -block:]
        # The pool's block is [block_size, kv_heads, head_dim]; transformers' [kv_heads, positions, head_dim].
        torch.testing.assert_close(caches[2 * layer][block_id].transpose(0, 1), keys, atol=1e-4, rtol=0)
        torch.testing.assert_close(caches[2 * layer + 1][block_id].transpose(0, 1), values, atol=1e-4, rtol=0)


def test_sampled_requests_speculate_and_reproduce(llm, tokenizer):
    from vllm import SamplingParams

    prompt = prompt_of(40, tokenizer)
    params = SamplingParams(max_tokens=16, temperature=0.8, top_k=20, seed=3, ignore_eos=True)
    first, _ = generate(llm, [prompt, prompt], params)
    assert first[0] == first[1] and len(first[0]) == 16


class GraphCallLog:
    """The runner's graph calls, by step: (runtime method, the requests of its rows by their caller's id). The
    runtime methods are wrapped, and call through: what runs is the real model."""

    METHODS = ("verify", "decode", "prefill_and_decode", "prefill", "prefill_batch", "prefill_positions")

    def __init__(self, runner, monkeypatch) -> None:
        self.runner, self.steps, self._depth = runner, [], 0
        for name in self.METHODS:
            monkeypatch.setattr(runner.model, name, self._logged(name, getattr(runner.model, name)))
        execute = runner.execute
        monkeypatch.setattr(runner, "execute", lambda *a, **k: (self.steps.append([]), execute(*a, **k))[1])

    def _logged(self, name, method):
        def call(*args, **kwargs):
            if self._depth == 0:  # a runtime method calling another (prefill -> prefill_batch) is one call
                self.steps[-1].append((name, self._requests(name, args)))
            self._depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self._depth -= 1

        return call

    def _requests(self, name: str, args) -> list[str]:
        slots = {
            "verify": lambda: list(args[0]),
            "decode": lambda: list(args[0]),
            "prefill_and_decode": lambda: [*args[3], args[0]],
            "prefill_batch": lambda: [p[0] for p in args[0]],
        }.get(name, lambda: [args[0]])()
        owner = {s.slot: req_id.split("-")[0] for req_id, s in self.runner.requests.items()}
        return [owner[slot] for slot in slots]


def test_a_steps_graph_calls_run_in_the_documented_order(llm, tokenizer, tiny_hf, monkeypatch):
    """One step holding every kind of work (runner/call_plan.py): the verify call of the request with drafts, the
    decode of a request that may not speculate (it asks for logprobs) riding in the first prompt slice's chunk (a
    request sharing the decoding request's first blocks: it prefills from there), then the other prompt slice. Every
    request gets transformers' greedy tokens."""
    from vllm import SamplingParams

    engine, calls = llm.llm_engine, GraphCallLog(runner(llm), monkeypatch)
    base = prompt_of(2 * 19, tokenizer, offset=2)  # the words twice: n-gram drafts from the first step on
    prompts = {"holder": base, "plain": prompt_of(20, tokenizer, offset=7)}
    prompts |= {"copier": base[:30] + prompt_of(5, tokenizer, offset=11), "fresh": prompt_of(9, tokenizer, offset=4)}
    new_tokens = 12
    params = {name: greedy(new_tokens) for name in prompts}
    params["plain"] = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, logprobs=1)
    scheduler = engine.engine_core.engine_core.scheduler
    for name in ("holder", "plain"):
        engine.add_request(name, {"prompt_token_ids": prompts[name]}, params[name])
    finished = {}
    for _ in range(4):  # until the holder has drafts for the next step
        finished.update({o.request_id: o for o in engine.step() if o.finished})
        if any(r.spec_token_ids for i, r in scheduler.requests.items() if i.startswith("holder")):
            break
    for name in ("copier", "fresh"):
        engine.add_request(name, {"prompt_token_ids": prompts[name]}, params[name])
    finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert calls.steps[-1] == [
        ("verify", ["holder"]),
        ("prefill_and_decode", ["plain", "copier"]),
        ("prefill", ["fresh"]),
    ]
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    outputs = {name: list(finished[name].outputs[0].token_ids) for name in prompts}
    assert outputs == {name: hf_greedy(tiny_hf, p, new_tokens) for name, p in prompts.items()}


REFUSED = {
    "another-k": (dict(speculative_config=dict(NGRAM, num_speculative_tokens=2)), 'set "num_speculative_tokens": 3'),
    "interleaved": (
        dict(speculative_config=NGRAM, additional_config={"prefill_mode": "interleaved"}),
        "speculative decoding is not supported with ONP_PREFILL_MODE=interleaved",
    ),
}


@pytest.mark.parametrize("name", REFUSED)
def test_what_the_verify_graphs_cannot_check_is_refused(spec_dir, monkeypatch, name):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    kwargs, message = REFUSED[name]
    with pytest.raises(ValueError, match=re.escape(message)):
        EngineArgs(model=str(spec_dir), **kwargs).create_engine_config(UsageContext.LLM_CLASS)


def test_a_bad_min_acceptance_is_refused_at_startup(spec_dir, monkeypatch):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    monkeypatch.setenv(MIN_ACCEPTANCE_ENV, "1.5")
    with pytest.raises(ValueError, match=re.escape("ONP_SPECULATION_MIN_ACCEPTANCE='1.5' is outside [0, 1]")):
        EngineArgs(model=str(spec_dir), speculative_config=NGRAM).create_engine_config(UsageContext.LLM_CLASS)


def paused_steps(gate: DraftGate, steps: int) -> list[bool]:
    return [not gate.open() for _ in range(steps)]


def test_rejected_drafts_pause_drafting_for_doubling_pauses():
    """A request whose drafts keep failing stops drafting for 4, then 8 steps; good drafts keep it drafting and
    reset the pause; a threshold of 0 never pauses."""
    first = DraftGate(threshold=0.35)
    first.verified(drafted=4, accepted=1)  # the first verify counts alone: 0.25
    assert paused_steps(first, 5) == [True] * 4 + [False]
    gate = DraftGate(threshold=0.35)
    gate.verified(drafted=4, accepted=4)
    gate.verified(drafted=4, accepted=1)  # running rate 0.625: above the threshold
    assert paused_steps(gate, 3) == [False] * 3
    gate.verified(drafted=4, accepted=0)  # 0.31
    assert paused_steps(gate, 5) == [True] * 4 + [False]
    gate.verified(drafted=4, accepted=0)  # right after a pause one bad verify pauses again, twice as long
    assert paused_steps(gate, 9) == [True] * 8 + [False]
    gate.verified(drafted=4, accepted=3)  # a good one resets the pause
    gate.verified(drafted=4, accepted=0)
    assert paused_steps(gate, 5) == [True] * 4 + [False]
    never = DraftGate(threshold=0.0)
    for _ in range(10):
        never.verified(drafted=4, accepted=0)
    assert paused_steps(never, 3) == [False] * 3


def runner(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.runner


@pytest.fixture
def priced_runner(llm):
    """The engine's runner, whose verify costs a test sets (the module's engine verifies every draft:
    ONP_SPECULATION_MIN_ACCEPTANCE=0 measures none); put back to none after the test."""
    run = runner(llm)
    yield run
    run.speculation.verify_costs = None


def priced(model, decode: dict[int, float], verify: dict[int, float]) -> VerifyCosts:
    """Seconds per call of every token_generation / verify graph by its rows (all context buckets alike)."""
    prices = {TOKEN_GENERATION: decode, VERIFY: verify}
    return VerifyCosts(GraphLatencies({spec_key(s): prices[s.name][s.rows] for s in model.specs if s.name in prices}))


def test_drafts_pay_when_their_expected_tokens_outrun_the_verify_calls_cost(priced_runner):
    """A verify call of 4 rows at 2.5 decode calls loses 6 tokens' worth: one row's drafts (at most K = 3 more
    tokens) never pay, two rows' do at a high rate; a lone row's verify call at 1.3 decode calls pays above 0.1."""
    model = priced_runner.model
    assert model.neuron_config.decode_batch_sizes == (1, 4)
    costs = priced(model, decode={1: 1.0, 4: 1.0}, verify={1: 1.3, 4: 2.5})

    def rows(*drafting: float, idle: int = 0, plain: int = 0) -> list[NextRow]:
        return (
            [NextRow(20, K, rate) for rate in drafting]
            + [NextRow(20, 0, 1.0)] * idle
            + [NextRow(20, 0, 1.0, speculates=False)] * plain
        )

    assert not costs.drafts_pay(model, rows(1.0, idle=3))  # 3 > 4 x 1.5 fails
    assert costs.drafts_pay(model, rows(1.0, 1.0, 1.0, idle=1))  # 9 > 6
    assert not costs.drafts_pay(model, rows(0.9, 0.9, idle=2))  # 5.4 < 6
    assert costs.drafts_pay(model, rows(0.2))  # 0.6 > 0.3
    assert not costs.drafts_pay(model, rows(0.05))  # 0.15 < 0.3
    assert not costs.drafts_pay(model, rows(idle=1))  # no drafts
    # A row that may not speculate decodes apart: a verify call of 1 row (1.3) plus a decode call of 1 (1.0)
    # against one decode call of both (1.0): 2 + 3 x rate tokens must beat 2 x 2.3.
    assert costs.drafts_pay(model, rows(1.0, plain=1)) and not costs.drafts_pay(model, rows(0.8, plain=1))
    assert costs.verify_over_decode(model) == {1: 1.3, 4: 2.5}
    pooled = PooledRate()  # a request's rate before its first verify: all verify calls' running acceptance
    pooled.verified(drafted=8, accepted=2)
    pooled.verified(drafted=0, accepted=0)
    assert pooled.rate == 0.625


def test_drafts_that_do_not_pay_never_reach_vllm(llm, priced_runner, tokenizer, tiny_hf, stats_file):
    """With a verify call priced at 100 decode calls the runner proposes no drafts (none verified) and the tokens
    are greedy decoding's; priced like a decode call, the same prompts draft again."""
    model = priced_runner.model
    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate([40, 61, 23])]
    expected = [hf_greedy(tiny_hf, p, 16) for p in prompts]
    drafted = {}
    for verify_seconds in (100.0, 1.0):
        priced_runner.speculation.verify_costs = priced(
            model, decode={1: 1.0, 4: 1.0}, verify={1: verify_seconds, 4: verify_seconds}
        )
        served, ids = generate(llm, prompts, greedy(16))
        assert served == expected
        generate(llm, [prompts[0]], greedy(1))  # a later step writes the runner's records of the requests above
        drafted[verify_seconds] = sum(r["draft_tokens"] for r in stats(stats_file, ids))
    assert drafted[100.0] == 0 and drafted[1.0] > 0, drafted


def test_startup_times_every_decode_and_verify_graph(llm, priced_runner):
    """VerifyCosts.measure (the warm-up's, with drafts gated) times each token_generation and verify graph; it runs
    them on row 0, whose block table points at the null block while no request runs (at startup too): no block of
    vLLM's is written."""
    model = priced_runner.model
    measured = VerifyCosts.measure(model).latencies.seconds
    wanted = {s for s in model.specs if s.name in (TOKEN_GENERATION, VERIFY)}
    assert set(measured) == {spec_key(s) for s in wanted} and {s.rows for s in wanted} == {1, 4}
    assert all(0 < seconds < 10 for seconds in measured.values())
