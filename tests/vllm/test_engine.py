"""In-process vllm.LLM on a chunked, on-device-sampling artifact (serial prefill mode)."""

from __future__ import annotations

import pytest
from support.engine import close_llm, make_llm
from support.references import assert_prompt_logprobs_are_hf, hf_greedy, runtime_greedy
from support.served import BATCH_SIZE, CHUNK, SEQUENCE_LENGTH, prompt_of
from vllm.exceptions import VLLMValidationError

from optimum_neuron_plugin import NeuronModelForCausalLM

NEW_TOKENS = 10
# Below one chunk, exactly one, several chunks plus a rest, one token; more prompts than batch_size.
LENGTHS = [5, CHUNK, 3 * CHUNK + 7, 1, 2 * CHUNK, 70, 9]


@pytest.fixture(scope="module")
def llm(prompt_logits_dir):
    engine = make_llm(prompt_logits_dir)
    yield engine
    close_llm(engine)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [prompt_of(n, tokenizer, offset=i) for i, n in enumerate(LENGTHS)]


def greedy(max_tokens: int = NEW_TOKENS, **kwargs):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kwargs)


def generate(llm, prompts: list[list[int]], params) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_greedy_equals_runtime_and_transformers(llm, prompts, prompt_logits_dir, tiny_hf):
    assert len(prompts) > BATCH_SIZE
    assert [len(p) for p in prompts] == LENGTHS
    served = generate(llm, prompts, greedy())
    runtime = NeuronModelForCausalLM.from_pretrained(prompt_logits_dir)
    for prompt, tokens in zip(prompts, served, strict=True):
        assert tokens == runtime_greedy(runtime, prompt, NEW_TOKENS) == hf_greedy(tiny_hf, prompt, NEW_TOKENS)


def test_batch_equals_one_at_a_time(llm, prompts):
    short, long = prompts[0], prompts[5]
    together = generate(llm, [short, long], greedy())
    alone = [generate(llm, [p], greedy())[0] for p in (short, long)]
    assert together == alone


def test_seeded_sampling_is_reproducible(llm, prompts):
    from vllm import SamplingParams

    def sample(seed):
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, top_p=0.9, top_k=50, seed=seed, ignore_eos=True)
        return generate(llm, prompts[:3], params)

    first = sample(1234)
    assert sample(1234) == first
    assert sample(4321) != first


def test_max_tokens_stop_token_ids_and_n(llm, prompts):
    from vllm import SamplingParams

    reference = generate(llm, [prompts[0]], greedy())[0]
    stop_at = reference[3]
    out = llm.generate([{"prompt_token_ids": prompts[0]}], greedy(stop_token_ids=[stop_at]), use_tqdm=False)[0].outputs[
        0
    ]
    assert list(out.token_ids) == reference[: reference.index(stop_at) + 1]
    assert out.finish_reason == "stop"
    out = llm.generate([{"prompt_token_ids": prompts[0]}], greedy(max_tokens=3), use_tqdm=False)[0].outputs[0]
    assert list(out.token_ids) == reference[:3] and out.finish_reason == "length"
    # n > 1: vLLM fans the request out into independent requests (one cache slot each).
    params = SamplingParams(n=3, max_tokens=4, temperature=1.0, seed=7, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)[0].outputs
    assert len(outs) == 3 and all(len(o.token_ids) == 4 for o in outs)


def test_a_prompt_may_fill_the_whole_sequence(llm, tokenizer):
    prompt = prompt_of(SEQUENCE_LENGTH - 1, tokenizer)
    tokens = generate(llm, [prompt], greedy())[0]
    assert len(tokens) == 1  # sampled from the prefill logits; the sequence is then full


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (dict(logprobs=21), "Requested sample logprobs of 21, which is greater than max allowed: 20"),
        (dict(logprobs=-1), r"Requested sample logprobs of \d+, which is greater than max allowed: 20"),
        (dict(logit_bias={t: 1.0 for t in range(33)}), r"logit_bias has 33 entries, .* take at most 32 per request"),
        (dict(top_k=1000), "top_k=1000 exceeds"),
        (dict(presence_penalty=0.5), "presence_penalty is not supported"),
    ],
)
def test_unsupported_parameters_are_rejected(llm, prompts, params, message):
    from vllm import SamplingParams

    with pytest.raises(VLLMValidationError, match=message):
        llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(max_tokens=2, **params), use_tqdm=False)


def test_device_logprobs_are_hf_log_softmax_with_vllm_ranks(llm, prompts, tiny_hf):
    """Sampled tokens (the first from host logits, the rest from the decode graphs, some riding in chunk_and_decode
    next to a longer prompt) carry vLLM's raw logprobs: the sampled token's, its rank, and the top `logprobs`."""
    import torch
    from vllm import SamplingParams

    chosen = [prompts[0], prompts[2], prompts[5]]
    params = [
        SamplingParams(max_tokens=6, temperature=2.0, seed=i, ignore_eos=True, logprobs=num)
        for i, num in enumerate((3, 0, 20))
    ]
    outputs = llm.generate([{"prompt_token_ids": p} for p in chosen], params, use_tqdm=False)
    ranks = []
    for prompt, param, output in zip(chosen, params, outputs, strict=True):
        out = output.outputs[0]
        tokens = list(out.token_ids)
        assert len(out.logprobs) == len(tokens) == 6
        with torch.no_grad():
            logits = tiny_hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), dim=-1)
        for position, (token, entry) in enumerate(zip(tokens, out.logprobs, strict=True)):
            row = expected[position]
            top = torch.topk(row, param.logprobs).indices.tolist()
            assert set(entry) == {token, *top}  # logprobs=0: the sampled token's only
            assert entry[token].rank == int((row >= row[token]).sum())
            ranks.append(entry[token].rank)
            for token_id, logprob in entry.items():
                assert logprob.logprob == pytest.approx(float(row[token_id]), abs=1e-3)
            assert [entry[t].rank for t in top] == list(range(1, len(top) + 1))
        assert out.cumulative_logprob == pytest.approx(
            sum(float(expected[i, t]) for i, t in enumerate(tokens)), abs=1e-2
        )
    assert max(ranks) > 1  # hot sampling drew tokens other than the argmax


def test_beam_search_scores_beams_with_hf_logprobs(llm, prompts, tiny_hf):
    """vLLM's beam search asks 2 * beam_width logprobs of one token per beam and step."""
    import torch
    from vllm.sampling_params import BeamSearchParams

    prompt = prompts[0]
    beams = llm.beam_search([{"prompt_token_ids": prompt}], BeamSearchParams(beam_width=2, max_tokens=3))[0].sequences
    assert len(beams) == 2
    for beam in beams:
        new = beam.tokens[len(prompt) :]
        assert len(new) == 3
        with torch.no_grad():
            logits = tiny_hf(torch.tensor([beam.tokens])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(new)[:, None]).sum()
        assert beam.cum_logprob == pytest.approx(float(expected), abs=1e-3)


def test_min_tokens_and_allowed_token_ids_hold_on_device(llm, prompts):
    """Tokens after the first are sampled by the decode graphs: their bitmask rows ban the stop token until
    min_tokens is reached and allow only allowed_token_ids."""
    from vllm import SamplingParams

    reference = generate(llm, prompts[:1], greedy(6))[0]
    stop = reference[1]  # the first token the device samples
    assert stop not in reference[:1]
    assert generate(llm, prompts[:1], greedy(6, stop_token_ids=[stop]))[0] == reference[:2]
    tokens = generate(llm, prompts[:1], greedy(6, stop_token_ids=[stop], min_tokens=4))[0]
    assert len(tokens) >= 4 and stop not in tokens[:4] and tokens[:1] == reference[:1]
    allowed = sorted({*reference[2:], 17, 300, 4095})
    for params in (
        greedy(6, allowed_token_ids=allowed),
        SamplingParams(max_tokens=6, ignore_eos=True, allowed_token_ids=allowed, temperature=1.5, seed=3),
    ):
        tokens = generate(llm, prompts[:2], params)
        assert all(len(t) == 6 and set(t) <= set(allowed) for t in tokens)


def hf_biased_greedy(tiny_hf, prompt: list[int], bias: dict[int, float], new_tokens: int) -> list[int]:
    """Greedy tokens of HF logits with vLLM's logit_bias added at every step."""
    import torch

    tokens = list(prompt)
    for _ in range(new_tokens):
        with torch.no_grad():
            logits = tiny_hf(torch.tensor([tokens])).logits[0, -1].float()
        logits[list(bias)] += torch.tensor(list(bias.values()))
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt) :]


def test_logit_bias_and_min_p_hold_on_device_with_raw_logprobs(llm, prompts, tiny_hf):
    """The first token comes from host logits (vLLM's processors), the rest from the decode graphs' logit_bias and
    min_p inputs: greedy follows HF's biased argmax; min_p 1 keeps only the most likely biased token, so a hot draw
    is that argmax too. Logprobs stay the raw (unbiased) distribution's."""
    import torch
    from vllm import SamplingParams

    reference = generate(llm, prompts[:1], greedy(6))[0]
    bias = {reference[2]: -100.0, 4095: 8.0, 300: 6.5}
    expected = hf_biased_greedy(tiny_hf, prompts[0], bias, 6)
    assert expected != reference
    hot = SamplingParams(max_tokens=6, temperature=1.5, min_p=1.0, seed=5, ignore_eos=True, logit_bias=bias)
    outputs = llm.generate(
        [{"prompt_token_ids": prompts[0]}] * 2 + [{"prompt_token_ids": prompts[5]}],
        [greedy(6, logit_bias=bias, logprobs=1), hot, greedy(6)],
        use_tqdm=False,
    )
    assert [list(o.outputs[0].token_ids) for o in outputs[:2]] == [expected, expected]
    assert list(outputs[2].outputs[0].token_ids) == generate(llm, [prompts[5]], greedy(6))[0]  # no bias: unchanged
    with torch.no_grad():
        logits = tiny_hf(torch.tensor([prompts[0] + expected])).logits[0, len(prompts[0]) - 1 : -1]
    raw = torch.log_softmax(logits.float(), dim=-1)
    for position, (token, entry) in enumerate(zip(expected, outputs[0].outputs[0].logprobs, strict=True)):
        assert entry[token].logprob == pytest.approx(float(raw[position, token]), abs=1e-3)
        assert entry[token].rank == int((raw[position] >= raw[position, token]).sum())


def test_too_long_prompt_is_rejected_and_the_engine_keeps_serving(llm, tokenizer, prompts):
    # vLLM's renderer rejects prompts beyond max_model_len itself; the platform rejects the rest.
    for length in (SEQUENCE_LENGTH, SEQUENCE_LENGTH + 1):
        with pytest.raises(VLLMValidationError, match=r"(shorten|reduce the length of) the (input )?prompt"):
            generate(llm, [prompt_of(length, tokenizer)], greedy())
    assert len(generate(llm, [prompts[0]], greedy())[0]) == NEW_TOKENS


def test_prompt_logprobs_are_hf_log_softmax_even_after_a_prefix_cache_hit(llm, prompts, tiny_hf):
    """A prompt of several chunks, prefilled on the prompt_logits graphs; asked again after its prefix was cached,
    it skips the hit (vLLM's rule) so every position is computed."""
    prompt = prompts[2]  # 3 chunks and 7 tokens
    assert len(prompt) > 3 * CHUNK
    plain = llm.generate([{"prompt_token_ids": prompt}], greedy(2), use_tqdm=False)[0]
    again = llm.generate([{"prompt_token_ids": prompt}], greedy(2), use_tqdm=False)[0]
    assert again.num_cached_tokens >= 3 * CHUNK  # the prefix is cached
    asked = llm.generate([{"prompt_token_ids": prompt}], greedy(2, prompt_logprobs=5), use_tqdm=False)[0]
    assert asked.num_cached_tokens == 0
    assert list(asked.outputs[0].token_ids) == list(plain.outputs[0].token_ids)
    assert_prompt_logprobs_are_hf(asked, prompt, 5, tiny_hf)
    # Next to other requests (the batch decodes while it prefills), and zero top logprobs: the prompt token's only.
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in (prompts[0], prompt, prompts[5])],
        [greedy(4), greedy(4, prompt_logprobs=0), greedy(4)],
        use_tqdm=False,
    )
    assert_prompt_logprobs_are_hf(outputs[1], prompt, 0, tiny_hf)
    assert outputs[0].prompt_logprobs is None
