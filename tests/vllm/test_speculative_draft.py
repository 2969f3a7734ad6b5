"""Speculative decoding with a draft model (vllm/spec_decode/draft_model.py): the proposer's drafts are the draft model's greedy
tokens (transformers) whatever its slots held before; served greedy tokens equal greedy decoding without drafts
with a draft that always agrees (the target's own weights: every draft accepted) and with one that rarely does (a
1-layer model of other random weights); sampled tokens follow the target's distribution; unusable drafts are
refused at startup with what to change.

Target: test_speculative.py's artifact (the served tiny Llama, verify graphs of K drafts). Drafts: chunked_dir (the
same weights without verify graphs) and a 1-layer tiny Llama of the same tokenizer.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from support.distributions import Params, compare
from support.engine import close_llm, make_llm
from support.references import hf_greedy
from support.served import CHUNK, SEQUENCE_LENGTH, SHAPE, SPECULATIVE_TOKENS, prompt_of
from support.smollm2 import smollm2_tokenizer
from support.tiny_models import export, save_tiny
from transformers import LlamaForCausalLM

pytestmark = pytest.mark.slow  # an in-process vLLM engine

K = SPECULATIVE_TOKENS
FAILURE = 1e-6


@pytest.fixture(scope="module")
def other_hf_dir(vllm_root):
    """A smaller tiny Llama (1 layer, other random weights) of the served model's tokenizer."""
    return save_tiny(
        vllm_root / "draft-hf", "llama", seed=1, tokenizer=smollm2_tokenizer(), num_hidden_layers=1,
        tie_word_embeddings=False, max_position_embeddings=256,
    )  # fmt: skip


@pytest.fixture(scope="module")
def other_dir(vllm_root, other_hf_dir):
    return export(other_hf_dir, vllm_root / "draft", **SHAPE, prefill_chunk_size=CHUNK, context_buckets=(128,))


def draft_config(draft_dir) -> dict:
    return {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": K}


@pytest.fixture(scope="module")
def llm(spec_dir, chunked_dir):
    """The target with its own weights as the draft: every greedy draft is accepted."""
    engine = make_llm(spec_dir, speculative_config=draft_config(chunked_dir), disable_log_stats=False)
    # Drafts always go to vLLM: which steps draft no longer hangs on graph timings taken at a loaded start-up
    # (test_speculative.py tests the costs); the per-request acceptance gate still applies.
    runner(engine).speculation.verify_costs = None
    yield engine
    close_llm(engine)


def runner(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.runner


@pytest.fixture
def other_draft(llm, other_dir):
    """The same engine proposing with the 1-layer draft (its runner's proposer swapped for this test)."""
    from optimum_neuron_plugin.vllm.spec_decode.draft_model import DraftModelDrafts

    run = runner(llm)
    mine, run.speculation.drafter = run.speculation.drafter, DraftModelDrafts(str(other_dir), K, SEQUENCE_LENGTH)
    yield run.speculation.drafter
    run.speculation.drafter = mine


def greedy(max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def generate(llm, prompts, params) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def accepted(llm) -> tuple[int, int]:
    """vLLM's spec-decode counters: (draft tokens, accepted tokens)."""
    found = {m.name.removeprefix("vllm:spec_decode_"): m for m in llm.get_metrics() if "spec_decode" in m.name}
    value = lambda name: getattr(found.get(name), "value", 0)  # noqa: E731
    return value("num_draft_tokens"), value("num_accepted_tokens")


def test_the_proposer_drafts_the_draft_models_greedy_tokens(other_dir, other_hf_dir, tokenizer):
    """Whatever its slots hold (nothing, a request that ran on, drafts of which some were rejected, another request
    sharing a prefix), each proposal is the draft model's greedy continuation of the request's tokens (HF), and
    none passes max_model_len."""
    from optimum_neuron_plugin.vllm.spec_decode.draft_model import DraftModelDrafts

    hf = LlamaForCausalLM.from_pretrained(other_hf_dir, dtype=torch.float32).eval()
    drafter = DraftModelDrafts(str(other_dir), K, SEQUENCE_LENGTH)
    a, b = prompt_of(37, tokenizer), prompt_of(5, tokenizer, offset=3)

    def check(slots, token_lists):
        drafts = drafter.propose(slots, token_lists)
        for tokens, got in zip(token_lists, drafts, strict=True):
            assert got == hf_greedy(hf, tokens, min(K, SEQUENCE_LENGTH - len(tokens))), len(tokens)
        return drafts

    first = check([2, 0], [a, b])  # new prompts: the chunk loop, side by side
    a_all = a + first[0] + [7]  # all K drafts accepted plus one token: the last draft was never fed
    b_none = b + [first[1][0] + 1]  # the first draft rejected
    check([2, 0], [a_all, b_none])
    check([2, 0], [a_all + [9], b_none + [11, 12, 13]])  # one new token; three new tokens (the chunk loop)
    check([2], [a[:20] + [5, 6]])  # another request in slot 2, sharing 20 tokens with what it holds
    check([1], [prompt_of(SEQUENCE_LENGTH - 2, tokenizer)])  # two positions left: two drafts


def test_proposals_over_growing_token_lists_match_the_draft_models_greedy_tokens(other_dir, other_hf_dir, tokenizer):
    """A request's token list grows in place from step to step (RequestState.all_token_ids): each slot's record is
    compared from where it last agreed with that list, and each proposal is still the draft model's greedy
    continuation (HF) whatever the drafts' fate; a slot's next request, another list, is compared from the start."""
    from vllm import SamplingParams

    from optimum_neuron_plugin.vllm.runner.request_state import RequestState
    from optimum_neuron_plugin.vllm.spec_decode.draft_model import DraftModelDrafts

    hf = LlamaForCausalLM.from_pretrained(other_hf_dir, dtype=torch.float32).eval()
    drafter = DraftModelDrafts(str(other_dir), K, SEQUENCE_LENGTH)
    a = RequestState.create("a", prompt_of(30, tokenizer), SamplingParams(temperature=0.0))
    for accepted in (K, 0, 1, K, 2):  # drafts accepted, then one token of the target's (a rejected draft's successor)
        tokens = a.all_token_ids
        drafts = drafter.propose([2], [tokens])[0]
        assert drafts == hf_greedy(hf, tokens, K), len(tokens)
        a.output_token_ids.extend(drafts[:accepted] + [(drafts[accepted] + 1) if accepted < K else 5])
        assert drafter.records[2][: len(tokens)] == tokens
    b_prompt = list(a.all_token_ids)  # the next request in slot 2: as long, its first token differs
    b_prompt[0] = (b_prompt[0] + 1) % 100
    b = RequestState.create("b", b_prompt, SamplingParams(temperature=0.0))
    assert drafter.propose([2], [b.all_token_ids]) == [hf_greedy(hf, b.all_token_ids, K)]


def test_greedy_with_a_draft_that_always_agrees(llm, tokenizer, tiny_hf):
    """The target's own weights as the draft: every draft accepted, and the tokens are greedy decoding's, also
    when max_tokens ends inside an accepted run (every length from 13 to 24) or at the sequence length."""
    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate([40, 23, 61, 9])]
    prompts.append(prompt_of(SEQUENCE_LENGTH - 7, tokenizer, offset=2))  # 6 new tokens fit
    drafted, kept = accepted(llm)
    served = generate(llm, prompts, greedy(24))
    for prompt, tokens in zip(prompts, served, strict=True):
        assert tokens == hf_greedy(tiny_hf, prompt, min(24, SEQUENCE_LENGTH - len(prompt))), len(prompt)
    after = accepted(llm)
    assert after[0] - drafted > 0 and after[0] - drafted == after[1] - kept  # every draft accepted
    reference = hf_greedy(tiny_hf, prompts[0], 24)
    lengths = list(range(13, 25))
    assert generate(llm, [prompts[0]] * len(lengths), [greedy(n) for n in lengths]) == [reference[:n] for n in lengths]


def test_greedy_with_prefix_cache_hits(llm, tokenizer, tiny_hf):
    """A wave of requests sharing a cached prefix (the target's blocks; the draft prefills its own rows): greedy
    decoding's tokens."""
    system = prompt_of(50, tokenizer, offset=6)
    generate(llm, [system + prompt_of(3, tokenizer, offset=1)], greedy(4))
    prompts = [system + prompt_of(5 + i, tokenizer, offset=10 + i) for i in range(4)]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(16), use_tqdm=False)
    block = runner(llm).block_size
    assert [o.num_cached_tokens for o in outputs] == [len(system) // block * block] * len(prompts)
    assert [list(o.outputs[0].token_ids) for o in outputs] == [hf_greedy(tiny_hf, p, 16) for p in prompts]


def test_greedy_with_a_draft_that_rarely_agrees(llm, other_draft, tokenizer, tiny_hf):
    """A 1-layer draft of other random weights: most drafts rejected, the tokens still greedy decoding's."""
    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate([40, 23, 61, 9, 30])]
    drafted, kept = accepted(llm)
    served = generate(llm, prompts, greedy(20))
    for prompt, tokens in zip(prompts, served, strict=True):
        assert tokens == hf_greedy(tiny_hf, prompt, 20), len(prompt)
    drafted, kept = accepted(llm)[0] - drafted, accepted(llm)[1] - kept
    assert drafted > 0 and kept < drafted / 2, (drafted, kept)


def test_sampled_tokens_follow_the_target_distribution(llm, tokenizer, tiny_hf):
    """Sampled requests (top_k 5) verifying greedy drafts: the rejection rule for a deterministic draft. Every token
    after the first (drawn by the verify step's acceptance) against the target's distribution in its context
    (transformers, support/distributions.py)."""
    from vllm import SamplingParams

    params = Params(temperature=1.0, top_k=5)
    prompt = prompt_of(20, tokenizer)
    requests = [SamplingParams(max_tokens=32, temperature=1.0, top_k=5, seed=s, ignore_eos=True) for s in range(8)]
    outputs = generate(llm, [prompt] * len(requests), requests)
    contexts, drawn = [], []
    for tokens in outputs:
        with torch.no_grad():
            logits = tiny_hf(torch.tensor([prompt + tokens])).logits[0].float()
        contexts.append(logits[len(prompt) : len(prompt) + len(tokens) - 1])
        drawn.append(torch.tensor(tokens[1:]))
    verdict = compare(torch.cat(contexts), torch.cat(drawn), params, None, FAILURE)
    assert verdict.l1 <= verdict.bound, verdict.explain()


def edited_copy(source, target, file: str, **changes):
    """A copy of an artifact's configuration files (no graphs: the startup checks read only these) with changes."""
    target.mkdir(exist_ok=True)
    for name in ("config.json", "neuron_config.json", "tokenizer.json"):
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    data = json.loads((target / file).read_text())
    (target / file).write_text(json.dumps({**data, **changes}))
    return target


def swapped_tokens(source, target):
    """A copy of an artifact's configuration files whose tokenizer maps two tokens to each other's ids."""
    edited_copy(source, target, "config.json")
    data = json.loads((target / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["alpha"], vocab["beta"] = vocab["beta"], vocab["alpha"]
    (target / "tokenizer.json").write_text(json.dumps(data))
    return target


SHORT = dict(sequence_length=64, context_buckets=[64], decode_buckets=[64], prefill_buckets=[0, 16, 32, 64])
REFUSED = {
    # vLLM's own check, before the plugin's: the draft's config.json is read when the configuration is built
    "missing": (lambda root, draft, hf: root / "nowhere", "Invalid repository ID or local directory specified"),
    "hf-model": (lambda root, draft, hf: hf, "is not a model exported with this plugin"),
    # vLLM's own check, before the plugin's
    "vocabulary": (
        lambda root, draft, hf: edited_copy(draft, root / "vocab", "config.json", vocab_size=1000),
        "Target and draft model should have the same vocabulary size",
    ),
    "tokenizer": (
        lambda root, draft, hf: swapped_tokens(draft, root / "tokenizer"),
        "the draft's tokenizer differs from the target's: use a draft model of the same tokenizer",
    ),
    "batch": (
        lambda root, draft, hf: edited_copy(
            draft, root / "batch", "neuron_config.json", batch_size=2, decode_batch_sizes=[1, 2]
        ),
        "the draft's batch_size 2 is below the target's: export the draft again with --batch-size 4",
    ),
    "length": (
        lambda root, draft, hf: edited_copy(draft, root / "length", "neuron_config.json", **SHORT),
        "the draft's sequence_length 64 is below max_model_len 128: export the draft again with --sequence-length 128",
    ),
    "eagle": (None, "speculative decoding method 'eagle3' is not supported by the Neuron plugin: use"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_unusable_drafts_are_refused_at_startup(spec_dir, other_dir, other_hf_dir, vllm_root, monkeypatch, name):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    monkeypatch.delenv("ONP_PREFILL_MODE", raising=False)
    make, message = REFUSED[name]
    (vllm_root / "refused").mkdir(exist_ok=True)
    if make is None:
        spec = {"method": "eagle3", "model": str(other_hf_dir), "num_speculative_tokens": K}
    else:
        spec = draft_config(make(vllm_root / "refused", other_dir, other_hf_dir))
    with pytest.raises(ValueError, match=re.escape(message)):
        EngineArgs(model=str(spec_dir), speculative_config=spec).create_engine_config(UsageContext.LLM_CLASS)
