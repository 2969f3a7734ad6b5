"""When a graph call of a step fails and its work runs again apart (runner's fallbacks), the requests that did not
fail get exactly the tokens they get without the failure: no draw of a seeded request spent twice, no token
recorded twice.

The model has a 1000-row embedding table behind SmolLM2's 49152-id tokenizer (as tests/reliability's small-vocab
model): a prompt holding a larger id makes the prefill graph raise (IndexError) at run time, a real graph failure.
The export batches prompt chunks (prefill_batch_size) and fuses a chunk with the decode batch (chunk_and_decode);
two context buckets (16, 128) keep it small, and a decode row past position 15 rides in no chunk of a short prompt.
"""

from __future__ import annotations

import pytest
import torch
from support.engine import close_llm, make_llm
from support.references import hf_greedy
from support.served import BATCH_SIZE, CHUNK, SHAPE
from support.tiny_models import export, save_tiny
from transformers import LlamaForCausalLM

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
