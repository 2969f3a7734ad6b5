"""Interleaved prefill policy: decisions of vLLM's real Scheduler as the plugin configures it, and greedy outputs.

The scheduler is the class the plugin's engine config names (NeuronScheduler on vLLM's Scheduler),
built from the engine config the platform derives from a real artifact, fed real vLLM Request
objects. Each step the test reports back what the runner would: one token for every request that
finished its prompt or decoded.
"""

from __future__ import annotations

import json
import logging
import math
from itertools import count

import pytest
from support.engine import block_hasher, close_llm, make_llm
from support.references import hf_greedy
from support.served import BATCH_SIZE, CHUNK, SEQUENCE_LENGTH, prompt_of
from support.tiny_models import export

from optimum_neuron_plugin.vllm.engine.options import prefill_chunk_budget, prefill_target_itl
from optimum_neuron_plugin.vllm.scheduler.interleave import DEFAULT_MAX_PASSES
from optimum_neuron_plugin.vllm.scheduler.step_budget import measured_kind

TAIL = CHUNK // 2  # batched_dir's tail graphs
_arrivals = count()


def interleaved_config(model, scheduling_policy: str = "fcfs", **additional):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    args = EngineArgs(
        model=str(model), scheduling_policy=scheduling_policy,
        additional_config={"prefill_mode": "interleaved", **additional},
    )  # fmt: skip
    return args.create_engine_config(UsageContext.LLM_CLASS)


def make_scheduler(model, scheduling_policy: str = "fcfs", vllm_own_tokens: int | None = None, **additional):
    """vllm_own_tokens: vLLM's own Scheduler instead, with that max_num_batched_tokens, on the same pool."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from optimum_neuron_plugin.artifact import load_neuron_config
    from optimum_neuron_plugin.vllm.engine.kv_spec import layer_names

    config = interleaved_config(model, scheduling_policy, **additional)
    cache = config.cache_config
    cache.num_gpu_blocks = load_neuron_config(str(model)).num_blocks
    spec = FullAttentionSpec(block_size=cache.block_size, num_kv_heads=2, head_size=16, dtype=config.model_config.dtype)
    kv_cache_config = KVCacheConfig(
        num_blocks=cache.num_gpu_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names(2), spec)],
    )
    scheduler_cls = config.scheduler_config.get_scheduler_cls()
    if vllm_own_tokens is not None:
        from vllm.v1.core.sched.scheduler import Scheduler

        scheduler_cls, config.scheduler_config.max_num_batched_tokens = Scheduler, vllm_own_tokens
    return scheduler_cls(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=cache.block_size,
    )


def add(scheduler, req_id: str, prompt_len: int, max_tokens: int = 4, priority: int = 0):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    # A first token of its own: no prompt shares a prefix with another, so no prefix-cache hit shortens a prefill.
    prompt = [100 + len(scheduler.requests), *range(2, prompt_len + 1)]
    request = Request(
        req_id, prompt, params, None, arrival_time=float(next(_arrivals)), priority=priority,
        block_hasher=block_hasher(scheduler.block_size),
    )  # fmt: skip
    scheduler.add_request(request)
    return request


def step(scheduler, latencies=None) -> dict[str, int]:
    """One engine step: tokens scheduled per request; requests whose prompt is complete sample token 7. latencies:
    the graph latencies the runner reports (with its first output)."""
    from optimum_neuron_plugin.vllm.contract import NeuronRunnerOutput

    output = scheduler.schedule()
    scheduled = dict(output.num_scheduled_tokens)
    req_ids = list(scheduled)
    sampled = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        sampled.append([7] if request.num_computed_tokens >= request.num_tokens else [])
    runner_output = NeuronRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
        graph_latencies=latencies,
    )
    scheduler.update_from_output(output, runner_output)
    return scheduled


def calls(tokens: int) -> int:
    return math.ceil(tokens / CHUNK)


@pytest.fixture
def scheduler(chunked_dir):
    return make_scheduler(chunked_dir)


def test_the_plugin_configures_its_scheduler(chunked_dir):
    from vllm.v1.core.sched.scheduler import Scheduler

    from optimum_neuron_plugin.vllm.scheduler.scheduler import NeuronScheduler

    scheduler = make_scheduler(chunked_dir)
    assert isinstance(scheduler, NeuronScheduler) and isinstance(scheduler, Scheduler)
    assert scheduler.interleave.chunk == CHUNK
    # Under the latency target the token budget holds a full-length prompt next to a decode for every slot.
    assert scheduler.max_num_scheduled_tokens == math.ceil(SEQUENCE_LENGTH / CHUNK) * CHUNK + BATCH_SIZE
    # A fixed budget: that many chunk calls.
    assert make_scheduler(chunked_dir, prefill_chunk_budget=2).max_num_scheduled_tokens == 2 * CHUNK + BATCH_SIZE


def test_slices_are_whole_chunks_except_the_last(scheduler):
    lengths = {"a": 5 * CHUNK + 3, "b": 2 * CHUNK + 1, "c": 7, "d": 3 * CHUNK}
    for req_id, n in lengths.items():
        add(scheduler, req_id, n)
    slices: dict[str, list[int]] = {r: [] for r in lengths}
    prefilled = dict.fromkeys(lengths, 0)
    for _ in range(40):
        for req_id, n in step(scheduler).items():
            if prefilled[req_id] < lengths[req_id]:
                slices[req_id].append(n)
                prefilled[req_id] += n
    assert prefilled == lengths
    for req_id, parts in slices.items():
        assert all(part % CHUNK == 0 for part in parts[:-1]), (req_id, parts)
        # Every slice starts on a chunk boundary: the prompt costs as many chunk calls as in serial mode.
        assert sum(calls(part) for part in parts) == calls(lengths[req_id]), (req_id, parts)


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_the_budget_counts_chunk_calls_and_decodes_come_first(chunked_dir, budget):
    scheduler = make_scheduler(chunked_dir, prefill_chunk_budget=budget)
    add(scheduler, "d1", 3, max_tokens=100)
    while not scheduler.requests["d1"].num_output_tokens:
        step(scheduler)
    lengths = {"long": 6 * CHUNK + 5, "mid": 2 * CHUNK + 9, "tiny": 1}
    for req_id, n in lengths.items():
        add(scheduler, req_id, n)
    prefilled = dict.fromkeys(lengths, 0)
    steps = 0
    while prefilled != lengths:
        scheduled = step(scheduler)
        steps += 1
        assert scheduled["d1"] == 1  # the decode, every step
        prefill = {r: n for r, n in scheduled.items() if r in lengths and prefilled[r] < lengths[r]}
        assert sum(calls(n) for n in prefill.values()) <= budget
        for req_id, n in prefill.items():
            prefilled[req_id] += n
    # (1 decode + 3 prompts fill the 4 slots.) 7 + 3 + 1 = 11 chunk calls at `budget` per step, nothing wasted but the last step's rest.
    assert steps == math.ceil(11 / budget)


def test_a_short_prompt_overtakes_a_long_one_in_progress(chunked_dir):
    scheduler = make_scheduler(chunked_dir, prefill_chunk_budget=2)
    add(scheduler, "long", 6 * CHUNK)
    assert step(scheduler) == {"long": 2 * CHUNK}
    add(scheduler, "short", 5)
    assert step(scheduler) == {"short": 5, "long": CHUNK}  # the short one first, the rest of the budget to long
    assert scheduler.requests["short"].num_output_tokens == 1  # its first token, from the second step
    assert step(scheduler) == {"short": 1, "long": 2 * CHUNK}


def test_fewest_remaining_tokens_first_among_waiting_prompts(chunked_dir):
    scheduler = make_scheduler(chunked_dir, prefill_chunk_budget=1)
    add(scheduler, "a", 3 * CHUNK)
    add(scheduler, "b", 2 * CHUNK)
    add(scheduler, "c", 10)
    order = [r for _ in range(6) for r, n in step(scheduler).items() if n > 1]  # decodes have 1 token
    assert order == ["c", "b", "b", "a", "a", "a"]


def test_aging_bounds_how_long_a_prompt_is_passed_over(chunked_dir):
    """One short prompt arrives every step and would always win on length: aging still serves the long one."""
    scheduler = make_scheduler(chunked_dir, prefill_chunk_budget=1)
    add(scheduler, "long", 7 * CHUNK)
    served_steps = []
    for i in range(60):
        add(scheduler, f"short-{i}", 3, max_tokens=1)
        if "long" in step(scheduler):
            served_steps.append(i)
        if scheduler.requests.get("long") is None or scheduler.requests["long"].num_output_tokens:
            break
    passed_over = [b - a - 1 for a, b in zip([-1, *served_steps], served_steps, strict=False)]
    # Passed over exactly max_passes times in a row, then served (the bound is max_passes + max_num_seqs - 1).
    assert passed_over[1:] and set(passed_over[1:]) == {DEFAULT_MAX_PASSES}
    assert len(served_steps) == 7


def test_priority_policy_admits_the_highest_priority_prompt_before_latencies_arrive(chunked_dir):
    """Free slots, a long prompt of priority 0 and a short one of priority 1, before the runner reported latencies
    (one chunk call per step): the long one is served first, at vLLM's queue head, and both finish."""
    scheduler = make_scheduler(chunked_dir, scheduling_policy="priority")
    add(scheduler, "long", 6 * CHUNK, priority=0)
    add(scheduler, "short", 5, priority=1)
    served: list[dict[str, int]] = []
    for _ in range(20):  # 7 chunk calls and 4 tokens each; a livelock would schedule nothing, every step
        served.append(step(scheduler))
        if not scheduler.requests:
            break
    assert served[0] == {"long": CHUNK}
    assert not scheduler.requests  # both finished
    prefilled = [r for scheduled in served for r, n in scheduled.items() if n > 1]
    assert prefilled == ["long"] * 6 + ["short"]  # priority order, not shortest first


def test_priority_policy_orders_prompts_by_priority_then_arrival(chunked_dir):
    scheduler = make_scheduler(chunked_dir, scheduling_policy="priority", prefill_chunk_budget=1)
    add(scheduler, "a", 3 * CHUNK, priority=1)
    add(scheduler, "b", 2 * CHUNK, priority=0)
    add(scheduler, "c", 10, priority=1)
    order = [r for _ in range(6) for r, n in step(scheduler).items() if n > 1]  # decodes have 1 token
    assert order == ["b", "b", "a", "a", "a", "c"]


def test_prefill_chunk_budget_option(monkeypatch, chunked_dir):
    monkeypatch.delenv("ONP_PREFILL_CHUNK_BUDGET", raising=False)
    assert prefill_chunk_budget({}) is None  # the latency target decides
    monkeypatch.setenv("ONP_PREFILL_CHUNK_BUDGET", "3")
    assert prefill_chunk_budget(None) == 3
    assert prefill_chunk_budget({"prefill_chunk_budget": 1}) == 1  # additional_config wins
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match="ONP_PREFILL_CHUNK_BUDGET .*1 or more"):
            prefill_chunk_budget({"prefill_chunk_budget": bad})
    config = interleaved_config(chunked_dir)
    assert config.scheduler_config.max_num_batched_tokens == 3 * CHUNK + BATCH_SIZE


# ---- a pool smaller than the running contexts ----------------------------------------------------------------

POOL_ROWS, POOL_BLOCKS = 16, 32  # 16 rows over 32 blocks of CHUNK tokens: 4 full-length sequences


@pytest.fixture(scope="module")
def pool_dir(vllm_root, tiny_hf_dir):
    return export(
        tiny_hf_dir, vllm_root / "small-pool", batch_size=POOL_ROWS, sequence_length=SEQUENCE_LENGTH,
        prefill_chunk_size=CHUNK, on_device_sampling=True, block_size=CHUNK, num_blocks=1 + POOL_BLOCKS,
        context_buckets=(SEQUENCE_LENGTH,), prefill_buckets=(0, SEQUENCE_LENGTH),
    )  # fmt: skip


def test_a_prompt_waits_for_the_blocks_of_the_prompts_in_flight(pool_dir):
    """Decoding requests hold 24 of the 32 blocks; a 7-block prompt is admitted and half prefilled; a 3-block
    prompt arrives. The free blocks hold it, but not with what the first prompt still needs: it waits until that
    prompt is done, rather than being admitted ahead of it (shortest first) and preempted when the first one takes
    the blocks, and nothing is preempted."""
    scheduler = make_scheduler(pool_dir, prefill_chunk_budget=2)
    requests = [add(scheduler, f"fill-{i}", 8 * CHUNK - 13, max_tokens=12) for i in range(3)]  # 8 blocks each
    while any(not r.num_output_tokens for r in requests):
        step(scheduler)
    requests.append(add(scheduler, "long", 7 * CHUNK, max_tokens=1))
    assert step(scheduler)["long"] == 2 * CHUNK
    requests.append(add(scheduler, "short", 3 * CHUNK, max_tokens=12))
    order = []
    while scheduler.requests:
        order += [r for r, n in step(scheduler).items() if n > 1]
    assert order == ["long"] * 3 + ["short"] * 2
    assert [r.num_preemptions for r in requests] == [0] * 5


def replay(scheduler, lengths: list[tuple[int, int]], clients: int) -> int:
    """Closed-loop clients over (prompt, output) lengths, one engine step at a time: the preemptions."""
    queue, live, preemptions = list(lengths), [], 0
    while queue or live:
        while queue and len(live) < clients:
            prompt, output = queue.pop(0)
            live.append(add(scheduler, f"r{len(queue)}", prompt, max_tokens=output))
        assert step(scheduler), "a step scheduled nothing while requests were unfinished: the plan stalled"
        preemptions += sum(r.num_preemptions for r in live if r.is_finished())
        live = [r for r in live if not r.is_finished()]
    return preemptions


@pytest.mark.parametrize("seed", [0, 1])
def test_interleaving_preempts_no_more_than_vllms_own_scheduler(pool_dir, seed):
    """Mixed chat lengths (most short, a few long) from as many clients as rows, on a pool that cannot hold their
    contexts: every step serves someone, and the interleaved plan preempts no more often than vLLM's own scheduler
    (the token budget of its CPU server) on the same pool. Before admission counted the blocks of the prompts in
    flight, it admitted prompts until every running request was a half-prefilled prompt, none of which the pool could
    finish, and planned the step's chunk for a waiting prompt vLLM could not admit: no step served anyone again."""
    import random

    rng = random.Random(seed)
    lengths = []
    for _ in range(48):
        prompt = max(4, min(SEQUENCE_LENGTH - 40, round(rng.lognormvariate(math.log(40), 1.0))))
        lengths.append((prompt, max(2, min(32, round(rng.lognormvariate(math.log(16), 1.0))))))
    plugin = replay(make_scheduler(pool_dir), lengths, POOL_ROWS)
    vllm_own = replay(make_scheduler(pool_dir, vllm_own_tokens=2048), lengths, POOL_ROWS)
    assert vllm_own > 0, "the pool held every context: nothing to compare"
    assert plugin <= vllm_own, (plugin, vllm_own)


# ---- the latency target (scheduler/step_budget.py) ---------------------------------------------------------


def latencies_of(model, decode: float, chunk, tail: float | None = None) -> object:
    """GraphLatencies for every graph the target reads: `decode` seconds per token_generation call, chunk(bucket)
    seconds per one-row chunk call (`tail` seconds on a tail graph, when given)."""
    from optimum_neuron_plugin.artifact import load_neuron_config
    from optimum_neuron_plugin.graphs import TOKEN_GENERATION, graph_specs
    from optimum_neuron_plugin.runtime.graph_select import spec_key
    from optimum_neuron_plugin.runtime.latency import GraphLatencies
    from optimum_neuron_plugin.vllm.scheduler.step_budget import measured_kind

    nc = load_neuron_config(str(model))
    specs = [s for s in graph_specs(nc, vocab_size=256) if measured_kind(nc, s.name, s.rows)]

    def seconds(spec) -> float:
        if spec.name == TOKEN_GENERATION:
            return decode
        return tail if spec.tail and tail is not None else chunk(spec.bucket)

    return GraphLatencies({spec_key(s): seconds(s) for s in specs})


def start_decode(scheduler, latencies=None) -> None:
    add(scheduler, "d1", 3, max_tokens=100)
    while not scheduler.requests["d1"].num_output_tokens:
        step(scheduler, latencies)


def prefill_calls(scheduled: dict[str, int]) -> int:
    return sum(calls(n) for r, n in scheduled.items() if n > 1 or r != "d1")


def test_the_target_sets_how_many_chunk_calls_a_step_runs(chunked_dir):
    scheduler = make_scheduler(chunked_dir, prefill_target_itl_ms=100)
    add(scheduler, "long", 7 * CHUNK)
    assert step(scheduler) == {"long": CHUNK}  # no latencies yet: one chunk call
    # 10 ms decodes and 40 ms chunks: 100 ms hold the decode and two chunk calls.
    start_decode(scheduler, latencies_of(chunked_dir, 0.010, lambda bucket: 0.040))
    assert scheduler.step_time.target == pytest.approx(0.1)
    scheduled = step(scheduler)
    assert scheduled["d1"] == 1 and prefill_calls(scheduled) == 2


def test_steps_fit_the_target_with_costs_that_grow_with_the_context(chunked_dir):
    scheduler = make_scheduler(chunked_dir, prefill_target_itl_ms=60)
    latencies = latencies_of(chunked_dir, 0.010, lambda bucket: 0.005 + 0.0004 * bucket)
    step(scheduler, latencies)  # an idle step carries the latencies
    start_decode(scheduler)
    lengths = {"long": SEQUENCE_LENGTH - 8, "mid": 3 * CHUNK + 2}
    for req_id, n in lengths.items():
        add(scheduler, req_id, n)
    model, per_step = scheduler.step_time, []
    prefilled = dict.fromkeys(lengths, 0)
    while prefilled != lengths:
        decode_position = scheduler.requests["d1"].num_computed_tokens
        scheduled = {r: n for r, n in step(scheduler).items() if r in lengths and prefilled[r] < lengths[r]}
        costs = [
            model.chunk_seconds(prefilled[r] + offset, lengths[r] - prefilled[r] - offset)
            for r, n in scheduled.items()
            for offset in range(0, n, CHUNK)
        ]
        allowed = 0.060 - model.decode_seconds([decode_position])
        assert len(costs) >= 1 and (len(costs) == 1 or sum(costs) <= allowed + 1e-9), (scheduled, costs)
        per_step.append(len(costs))
        for r, n in scheduled.items():
            prefilled[r] += n
    # Chunks deep in the long prompt cost more: later steps run fewer of them.
    assert per_step[0] > per_step[-1] >= 1


def test_the_default_target_is_a_decode_plus_one_chunk_call(chunked_dir):
    scheduler = make_scheduler(chunked_dir)
    start_decode(scheduler, latencies_of(chunked_dir, 0.010, lambda bucket: 0.040))
    assert scheduler.step_time.target == pytest.approx(0.050)
    add(scheduler, "long", 5 * CHUNK)
    for _ in range(5):
        scheduled = step(scheduler)
        assert scheduled["d1"] == 1 and prefill_calls(scheduled) == 1


def test_a_lone_prompt_runs_a_prefill_batch_call_per_step(batched_dir):
    """Nothing decodes and no other prompt waits: the target bounds nobody's wait, so a step takes the chunks one
    prefill batch call holds (BATCH_SIZE here), as the serial chunk loop would; a second prompt brings the target
    back (one 40 ms chunk call in its default 50 ms), the shorter prompt first."""
    scheduler = make_scheduler(batched_dir)
    step(scheduler, latencies_of(batched_dir, 0.010, lambda bucket: 0.040, tail=0.015))  # an idle step
    add(scheduler, "long", SEQUENCE_LENGTH - 8)
    assert step(scheduler) == {"long": BATCH_SIZE * CHUNK}
    add(scheduler, "short", 2 * CHUNK, max_tokens=1)
    assert step(scheduler) == {"short": CHUNK}
    assert step(scheduler) == {"short": CHUNK}  # its first token, its last
    assert step(scheduler) == {"long": SEQUENCE_LENGTH - 8 - BATCH_SIZE * CHUNK}  # alone again: the rest at once


def prompt_slices(scheduler, req_id: str) -> list[int]:
    """The slices of req_id's prompt, step by step, until it is prefilled."""
    slices = []
    while scheduler.requests[req_id].num_output_tokens == 0:
        scheduled = step(scheduler)
        if req_id in scheduled:
            slices.append(scheduled[req_id])
    return slices


@pytest.mark.parametrize(("target_ms", "expected"), [(30, [TAIL] * 6 + [2]), (None, [CHUNK] * 3 + [2])])
def test_a_target_below_a_chunk_call_cuts_tail_pieces(batched_dir, target_ms, expected):
    """10 ms decodes, 40 ms chunk calls, 15 ms tail calls: a 30 ms target leaves 20 ms next to the decode, where a
    whole chunk does not fit and a tail piece does; the default target (50 ms) runs whole chunks."""
    scheduler = make_scheduler(batched_dir, **({} if target_ms is None else {"prefill_target_itl_ms": target_ms}))
    start_decode(scheduler, latencies_of(batched_dir, 0.010, lambda bucket: 0.040, tail=0.015))
    assert scheduler.step_time.narrow == (TAIL if target_ms else 0)
    add(scheduler, "long", 3 * CHUNK + 2)
    assert prompt_slices(scheduler, "long") == expected


def test_without_tail_graphs_a_target_below_a_chunk_call_runs_one_chunk_per_step(chunked_dir, caplog):
    """...and the scheduler says so when the latencies arrive, naming the export option that would help."""
    scheduler = make_scheduler(chunked_dir, prefill_target_itl_ms=30)
    with caplog.at_level(logging.WARNING):
        start_decode(scheduler, latencies_of(chunked_dir, 0.010, lambda bucket: 0.040))
    assert "ONP_PREFILL_TARGET_ITL_MS 30 ms is below a decode plus a chunk call (50 ms)" in caplog.text
    assert "export with --prefill-tail-size" in caplog.text
    add(scheduler, "long", 3 * CHUNK + 2)
    assert scheduler.step_time.narrow == 0
    assert prompt_slices(scheduler, "long") == [CHUNK] * 3 + [2]


def test_a_fixed_budget_plans_that_many_calls(chunked_dir):
    """With ONP_PREFILL_CHUNK_BUDGET the runner measures nothing and the scheduler plans the fixed count."""
    scheduler = make_scheduler(chunked_dir, prefill_chunk_budget=3)
    start_decode(scheduler)
    add(scheduler, "long", 7 * CHUNK)
    assert prefill_calls(step(scheduler)) == 3 and scheduler.step_time is None


def add_prompt(scheduler, req_id: str, prompt: list[int], max_tokens: int = 4):
    """A request with the given prompt (requests sharing one share its cached blocks)."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request = Request(
        req_id, prompt, params, None, arrival_time=float(next(_arrivals)), block_hasher=block_hasher(scheduler.block_size)
    )  # fmt: skip
    scheduler.add_request(request)
    return request


@pytest.mark.parametrize("budget", [1, 2])
def test_prompts_hit_but_for_their_last_token_cost_no_prefill_call(chunked_dir, budget):
    """Three prompts whose every token but the last is cached (the decode side of P/D: a KV connector loaded them)
    arrive with a long prompt: all three start in one step as decode rows (the runner feeds their last token to the
    decode graph), and the long prompt still gets the step's chunk calls. Before, each took one of the budget's
    calls: with a budget of 1, one started per step and the long prompt waited."""
    scheduler = make_scheduler(chunked_dir, prefill_chunk_budget=budget)
    block = scheduler.block_size
    shared = [50 + i for i in range(2 * block + 1)]
    first = add_prompt(scheduler, "first", shared, max_tokens=1)
    while not first.is_finished():
        step(scheduler)
    for i in range(3):
        add_prompt(scheduler, f"hit-{i}", shared)
    add(scheduler, "long", 6 * CHUNK)
    assert step(scheduler) == {"hit-0": 1, "hit-1": 1, "hit-2": 1, "long": budget * CHUNK}


def test_prefill_target_itl_option(monkeypatch):
    monkeypatch.delenv("ONP_PREFILL_CHUNK_BUDGET", raising=False)
    monkeypatch.delenv("ONP_PREFILL_TARGET_ITL_MS", raising=False)
    assert prefill_target_itl({}) is None
    monkeypatch.setenv("ONP_PREFILL_TARGET_ITL_MS", "250")
    assert prefill_target_itl(None) == pytest.approx(0.25)
    assert prefill_target_itl({"prefill_target_itl_ms": 80}) == pytest.approx(0.08)  # additional_config wins
    for bad in ("0", "fast", "-5", "inf"):
        with pytest.raises(ValueError, match="ONP_PREFILL_TARGET_ITL_MS .*milliseconds above 0"):
            prefill_target_itl({"prefill_target_itl_ms": bad})
    with pytest.raises(ValueError, match="not both"):
        prefill_target_itl({"prefill_chunk_budget": 2})


# ---- end to end ---------------------------------------------------------------------------------

NEW_TOKENS = 6


@pytest.fixture(scope="module")
def stats_file(vllm_root):
    return vllm_root / "interleave-policy-stats.jsonl"


@pytest.fixture(scope="module")
def llm(chunked_dir, stats_file):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONP_STATS_FILE", str(stats_file))
        engine = make_llm(chunked_dir, additional_config={"prefill_mode": "interleaved"})
        yield engine
        close_llm(engine)


@pytest.mark.slow  # an in-process vLLM engine
def test_mixed_long_and_short_traffic_equals_transformers(llm, tokenizer, tiny_hf, stats_file):
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    # Long prompts start; short ones arrive while they prefill and overtake them; more requests than slots.
    waves = [[("long-0", 6 * CHUNK + 3), ("long-1", 4 * CHUNK)], [("short-0", 5), ("mid", 2 * CHUNK + 1)]]
    waves += [[("short-1", 1), ("short-2", CHUNK)], [("long-2", 5 * CHUNK - 1)]]
    prompts = {}
    for offset, (req_id, n) in enumerate(r for wave in waves for r in wave):
        prompts[req_id] = prompt_of(n, tokenizer, offset=offset)
    outputs: dict[str, list[int]] = {r: [] for r in prompts}
    first_token_step: dict[str, int] = {}
    steps = 0
    for wave in waves:
        for req_id, _ in wave:
            engine.add_request(req_id, {"prompt_token_ids": prompts[req_id]}, params)
        for out in engine.step():
            outputs[out.request_id] = list(out.outputs[0].token_ids)
            first_token_step.setdefault(out.request_id, steps)
        steps += 1
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = list(out.outputs[0].token_ids)
            first_token_step.setdefault(out.request_id, steps)
        steps += 1
    for req_id, prompt in prompts.items():
        assert outputs[req_id] == hf_greedy(tiny_hf, prompt, NEW_TOKENS), req_id
    # The runner measured every graph the latency target reads at warm-up; the scheduler has them.
    core = engine.engine_core.engine_core
    model = core.model_executor.driver_worker.worker.runner.model
    nc = model.neuron_config
    measured = {(s.name, s.rows, s.bucket, s.tail) for s in model.specs if measured_kind(nc, s.name, s.rows)}
    seconds = core.scheduler.step_time.seconds
    assert set(seconds) == measured and all(v > 0 for v in seconds.values())
    assert first_token_step["short-0"] < first_token_step["long-0"]  # overtook a long prompt in progress
    # The runner writes a request's stats when the next step tells it the request finished.
    llm.generate([{"prompt_token_ids": prompt_of(2, tokenizer)}], SamplingParams(max_tokens=1), use_tqdm=False)
    records = {r["req_id"]: r for r in map(json.loads, stats_file.read_text().splitlines())}
    for req_id, prompt in prompts.items():
        record = next(r for k, r in records.items() if k.startswith(req_id))
        assert record["prefill_calls"] == calls(len(prompt)), req_id  # as many calls as in serial mode
