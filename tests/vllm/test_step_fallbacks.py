"""When a graph call of a step fails and its work runs again apart (runner's fallbacks), the requests that did not
fail get exactly the tokens they get without the failure: no draw of a seeded request spent twice, no token
recorded twice. A failing verify call decodes its rows without their drafts, a failed prefill's blocks leave vLLM's
prefix cache (the requests that were to share them prefill them), and a call kind that keeps failing is retired: its
calls run as their fallback from then on.

The model has a 1000-row embedding table behind SmolLM2's 49152-id tokenizer (as tests/reliability's small-vocab
model): a prompt holding a larger id makes the prefill graph raise (IndexError) at run time, a real graph failure.
The export batches prompt chunks (prefill_batch_size) and fuses a chunk with the decode batch (chunk_and_decode);
two context buckets (16, 128) keep it small, and a decode row past position 15 rides in no chunk of a short prompt.
Other failures are injected where the runtime calls a compiled graph (FailingGraph): the loaded graph of that kind
raises instead of running. Speculative decoding runs on the served tiny model's export with verify graphs.
"""

from __future__ import annotations

import logging

import pytest
import torch
from support.engine import close_llm, make_llm
from support.references import hf_greedy
from support.served import BATCH_SIZE, CHUNK, SHAPE, SPECULATIVE_TOKENS, prompt_of
from support.tiny_models import export, save_tiny
from transformers import LlamaForCausalLM

from optimum_neuron_plugin.graphs import CHUNK_AND_DECODE, VERIFY
from optimum_neuron_plugin.vllm.runner.health import RETIRE_AFTER, GraphHealth
from optimum_neuron_plugin.vllm.spec_decode.draft_gate import MIN_ACCEPTANCE_ENV

pytestmark = pytest.mark.slow  # an in-process vLLM engine

EMBEDDING_ROWS = 1000
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def small_vocab(vllm_root, tokenizer):
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = dict(vocab_size=EMBEDDING_ROWS, tie_word_embeddings=False, max_position_embeddings=256, **special)
    source = save_tiny(vllm_root / "fallbacks-hf", "llama", seed=1, tokenizer=tokenizer, **config)
    artifact = export(
        source, vllm_root / "fallbacks", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True,
        prefill_batch_size=BATCH_SIZE, context_buckets=(CHUNK, SHAPE["sequence_length"]),
        prefill_buckets=(0, CHUNK, SHAPE["sequence_length"]),
    )  # fmt: skip
    return artifact, LlamaForCausalLM.from_pretrained(source, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def stats_file(vllm_root):
    return vllm_root / "fallbacks-stats.jsonl"


@pytest.fixture(scope="module")
def llm(small_vocab, stats_file):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONP_STATS_FILE", str(stats_file))
        engine = make_llm(small_vocab[0])
    yield engine
    close_llm(engine)


@pytest.fixture(scope="module")
def speculative(spec_dir):
    """n-gram speculation on the served tiny model's export with verify graphs; every draft goes to vLLM."""
    ngram = {"method": "ngram", "num_speculative_tokens": SPECULATIVE_TOKENS, "prompt_lookup_max": 3,
             "prompt_lookup_min": 1}  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MIN_ACCEPTANCE_ENV, "0")
        engine = make_llm(spec_dir, speculative_config=ngram, disable_log_stats=False)
    yield engine
    close_llm(engine)


def runner_of(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.runner


class FailingGraph:
    """Every call of the compiled graphs named `name` raises (the first `times` only, when given), counted. The
    runner gets a health of its own for the test, so what it retires ends with the test."""

    def __init__(self, llm, monkeypatch, name: str, times: int | None = None) -> None:
        self.runner, self.attempts = runner_of(llm), 0
        graphs = self.runner.model.graph_set.graphs

        def run(spec, *inputs):
            if spec.name == name:
                self.attempts += 1
                if times is None or self.attempts <= times:
                    raise RuntimeError(f"{name} failed on purpose")
            return graphs(spec, *inputs)

        monkeypatch.setattr(self.runner.model.graph_set, "graphs", run)
        monkeypatch.setattr(self.runner.calls, "health", GraphHealth())

    @property
    def health(self) -> GraphHealth:
        return self.runner.calls.health


@pytest.fixture
def warnings():
    """The guarded call loop's warnings."""
    logger, captured = logging.getLogger("vllm.plugins.optimum_neuron_plugin.vllm.runner.call_loop"), []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: captured.append(record.getMessage())
    logger.addHandler(handler)
    yield captured
    logger.removeHandler(handler)


def good_prompt(i: int, length: int) -> list[int]:
    return [(37 * i + 11 * j + 3) % EMBEDDING_ROWS for j in range(length)]


def bad_prompt() -> list[int]:
    return [5, 6, EMBEDDING_ROWS + 4000, 8]  # one id beyond the embedding table


def run(llm, first: dict[str, tuple[list[int], object]], later: dict[str, tuple[list[int], object]], steps: int):
    """`first` requests, `steps` engine steps, then the `later` ones; every request's final output by id."""
    engine = llm.llm_engine
    for req_id, (prompt, params) in first.items():
        engine.add_request(req_id, {"prompt_token_ids": prompt}, params)
    finished = {}
    for _ in range(steps):
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    for req_id, (prompt, params) in later.items():
        engine.add_request(req_id, {"prompt_token_ids": prompt}, params)
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    return finished


def tokens(output) -> list[int]:
    return list(output.outputs[0].token_ids)


def test_a_seeded_request_samples_the_same_when_its_neighbours_prefill_fails(llm):
    """A seeded sampled request decodes past the first bucket when a bad prompt arrives: no chunk of that prompt can
    carry the decode batch, so the step decodes, then prefills; the prefill raises and the decode runs again apart.
    The seeded request's tokens are those it samples alone."""
    from vllm import SamplingParams

    seeded = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=1234, ignore_eos=True)
    prompt = good_prompt(1, CHUNK + 4)  # decodes from position 20: the 128 bucket
    alone = run(llm, {"alone": (prompt, seeded)}, {}, 0)["alone"]
    llm.reset_prefix_cache()  # the same prefill next to the bad prompt
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    outputs = run(llm, {"seeded": (prompt, seeded)}, {"bad": (bad_prompt(), greedy)}, steps=2)
    assert outputs["bad"].outputs[0].finish_reason == "error", outputs["bad"]
    assert tokens(outputs["seeded"]) == tokens(alone)


def test_a_failure_after_the_first_row_of_a_batched_prefill_records_nothing_twice(
    llm, small_vocab, stats_file, monkeypatch
):
    """Prompts arriving together are prefilled in one batched call; sampling the first token of its second row raises
    once (injected: the graph call itself returns every row at once, so only the host work after it can fail there).
    The prompts are then prefilled one at a time: every request gets what transformers generates, one token each per
    step, and its record counts one prefill step of one chunk call, not the failed call's as well."""
    import json

    from vllm import SamplingParams

    hf = small_vocab[1]
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.runner
    sample, calls = runner.host_sampler.sample, []

    def second_row_fails_once(logits, states):
        names = [s.req_id.split("-")[0] for s in states]  # vLLM's ids: the caller's, a dash, a suffix
        calls.extend(names)
        if "row1" in names and calls.count("row1") == 1:
            raise RuntimeError("host sampling failed on purpose")
        return sample(logits, states)

    monkeypatch.setattr(runner.host_sampler, "sample", second_row_fails_once)
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    prompts = {f"row{i}": good_prompt(10 + i, 5 + 3 * i) for i in range(3)}
    outputs = run(llm, {r: (p, greedy) for r, p in prompts.items()}, {}, 0)
    assert calls[:2] == ["row0", "row1"] and calls.count("row1") == 2  # the batched call's second row failed
    assert {r: tokens(outputs[r]) for r in prompts} == {r: hf_greedy(hf, p, NEW_TOKENS) for r, p in prompts.items()}
    run(llm, {"after": ([1, 2, 3], SamplingParams(max_tokens=1))}, {}, 0)  # the runner records finished requests
    records = {r["req_id"].split("-")[0]: r for r in map(json.loads, stats_file.read_text().splitlines())}
    assert [(records[r]["prefill_steps"], records[r]["prefill_calls"]) for r in prompts] == [(1, 1)] * len(prompts)
    assert [records[r]["output_tokens"] for r in prompts] == [NEW_TOKENS] * len(prompts)


def spec_counts(llm) -> tuple[int, int]:
    """vLLM's counts of draft tokens scheduled and accepted."""
    found = {m.name: getattr(m, "value", 0) for m in llm.get_metrics()}
    return found.get("vllm:spec_decode_num_draft_tokens", 0), found.get("vllm:spec_decode_num_accepted_tokens", 0)


def test_a_failing_verify_decodes_its_rows_without_drafts(speculative, tokenizer, tiny_hf, monkeypatch):
    """Every verify call raises: its rows decode one token each, every draft rejected, and get greedy decoding's
    tokens; vLLM counts their drafts with none accepted. A request that may not speculate (it asks for logprobs)
    decodes in the same steps, untouched."""
    from vllm import SamplingParams

    verify = FailingGraph(speculative, monkeypatch, VERIFY)
    base = prompt_of(19, tokenizer, offset=2)
    prompts = [base + base, prompt_of(19, tokenizer, offset=7) * 2, prompt_of(20, tokenizer, offset=4)]
    new_tokens = 12
    params = [
        SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, logprobs=n) for n in (None, None, 1)
    ]
    drafts, accepted = spec_counts(speculative)
    outputs = speculative.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [tokens(o) for o in outputs] == [hf_greedy(tiny_hf, p, new_tokens) for p in prompts]
    assert verify.attempts > 0
    after = spec_counts(speculative)
    assert after[0] > drafts and after[1] == accepted  # drafts scheduled, none accepted


def test_a_failed_prefill_leaves_no_block_cached_and_its_sharers_prefill_them(small_vocab):
    """Serial prefill: a prompt and the requests sharing its first blocks arrive in one step, and its prefill fails
    (an id beyond the embedding table after the shared part). vLLM had hashed its blocks when it allocated them: they
    leave its prefix cache, and the requests of the step that were to share them prefill them themselves (from
    position 0); each gets what transformers generates. A later request with the same prefix finds nothing cached."""
    from vllm import SamplingParams

    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    system = good_prompt(40, 4 * CHUNK)
    writer = system + bad_prompt()
    sharers = {f"sharer{i}": system + good_prompt(50 + i, 6 + i) for i in range(BATCH_SIZE - 1)}
    llm = make_llm(small_vocab[0], additional_config={"prefill_mode": "serial"})
    try:
        outputs = run(llm, {"writer": (writer, greedy)} | {r: (p, greedy) for r, p in sharers.items()}, {}, 0)
        later = system + good_prompt(60, 5)
        out = run(llm, {"later": (later, greedy)}, {}, 0)["later"]
    finally:
        close_llm(llm)
    assert outputs["writer"].outputs[0].finish_reason == "error"
    assert [outputs[r].num_cached_tokens for r in sharers] == [len(system)] * len(sharers)  # the writer's blocks
    hf = small_vocab[1]
    assert {r: tokens(outputs[r]) for r in sharers} == {r: hf_greedy(hf, p, NEW_TOKENS) for r, p in sharers.items()}
    assert out.num_cached_tokens == 0
    assert tokens(out) == hf_greedy(hf, later, NEW_TOKENS)


def test_a_graph_that_keeps_failing_is_retired_after_three_calls(llm, small_vocab, monkeypatch, warnings):
    """chunk_and_decode always raises while a request decodes and short prompts arrive one after the other (a chunk of
    each could carry the decode batch). It is attempted RETIRE_AFTER times, each time the decode and the chunk run
    apart; then one warning names it, its files and what runs instead, health lists it, and it is never called
    again. Every request gets what transformers generates."""
    from vllm import SamplingParams

    fused = FailingGraph(llm, monkeypatch, CHUNK_AND_DECODE)
    engine, finished = llm.llm_engine, {}
    prompts = {"decoding": (good_prompt(60, 4), 60)} | {
        f"short{i}": (good_prompt(61 + i, CHUNK + 4), 4) for i in range(6)
    }
    for req_id, (prompt, new_tokens) in prompts.items():
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(req_id, {"prompt_token_ids": prompt}, params)
        for _ in range(2):
            finished.update({o.request_id: o for o in engine.step() if o.finished})
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert {r: tokens(finished[r]) for r in prompts} == {
        r: hf_greedy(small_vocab[1], p, n) for r, (p, n) in prompts.items()
    }
    assert fused.attempts == RETIRE_AFTER
    retired = fused.health.retired[CHUNK_AND_DECODE]
    assert retired.graph == CHUNK_AND_DECODE and CHUNK_AND_DECODE in retired.files
    assert [w for w in warnings if "stops calling" in w] == [
        f"graph {CHUNK_AND_DECODE} ({retired.files}) raised in {RETIRE_AFTER} {CHUNK_AND_DECODE} calls in a row (the "
        f"last: RuntimeError: {CHUNK_AND_DECODE} failed on purpose): the server stops calling it and runs "
        "token_generation and the prompt chunk in separate calls instead"
    ]
    assert len(warnings) == RETIRE_AFTER  # one per failed call, the last the retirement
