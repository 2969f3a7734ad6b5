"""Sampling defaults from a model's generation_config.json, penalties and logit edits on host logits, --seed.

A tiny random Qwen2 (SmolLM2's tokenizer) whose generation_config.json sets repetition_penalty, top_k 1
(greedy) and max_new_tokens, as Qwen2 / Qwen2.5 Instruct ship a repetition penalty. vLLM merges these
into every request that does not set them (`--generation-config auto`, its default). Decision
(engine_config._generation_overrides): on an artifact that returns logits they are applied on the
host with vLLM's own sampler pieces; on an on-device-sampling artifact they are dropped with a startup
warning, while a request that sets them explicitly gets a 400.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from support.engine import close_llm, make_llm
from support.served import CHUNK, SEQUENCE_LENGTH, SHAPE, prompt_of
from support.tiny_models import export
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

pytestmark = pytest.mark.slow  # an in-process vLLM engine

PENALTY = 1.3
NEW_TOKENS = 10
LENGTHS = [5, 23, 40]


@pytest.fixture(scope="module")
def qwen2_dir(vllm_root, tiny_hf_dir):
    directory = vllm_root / "tiny-qwen2"
    if not (directory / "config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dir)
        torch.manual_seed(2)
        config = Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            initializer_range=0.1,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            tie_word_embeddings=False,
        )
        Qwen2ForCausalLM(config).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        # top_k 1: greedy for vLLM and for transformers (which wants do_sample with a top_k).
        generation = {
            "repetition_penalty": PENALTY,
            "do_sample": True,
            "top_k": 1,
            "max_new_tokens": NEW_TOKENS,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        }
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


@pytest.fixture(scope="module")
def qwen2_hf(qwen2_dir):
    return Qwen2ForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32).eval()


# One context bucket (6 graphs instead of the default ladder's 23: the tests are not about buckets).
ONE_BUCKET = dict(context_buckets=(SEQUENCE_LENGTH,), prefill_buckets=(0, SEQUENCE_LENGTH))


@pytest.fixture(scope="module")
def host_dir(vllm_root, qwen2_dir):
    """Chunked prefill, token_generation returns logits: every token is sampled on the host."""
    return export(
        qwen2_dir, vllm_root / "qwen2-host", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=False, **ONE_BUCKET
    )


@pytest.fixture(scope="module")
def device_dir(vllm_root, qwen2_dir):
    return export(
        qwen2_dir, vllm_root / "qwen2-device", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True, **ONE_BUCKET
    )


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [prompt_of(n, tokenizer, offset=2 * i) for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def host_llm(host_dir):
    engine = make_llm(host_dir)
    yield engine
    close_llm(engine)


def tokens(llm, prompts, params=None) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def hf_generate(model, prompt: list[int], **kwargs) -> list[int]:
    """Hugging Face generate, greedy; the model's generation config unless kwargs override it."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, **kwargs)
    return out[0, len(prompt) :].tolist()


def hf_openai_penalties(model, prompt: list[int], presence: float, frequency: float, n: int) -> list[int]:
    """Greedy over HF logits with OpenAI's presence / frequency penalties on generated tokens (HF has none)."""
    generated: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([prompt + generated])).logits[0, -1]
            counts = torch.bincount(torch.tensor(generated, dtype=torch.long), minlength=logits.numel())
            logits = logits - frequency * counts - presence * (counts > 0)
            generated.append(int(logits.argmax()))
    return generated


def test_a_default_request_applies_the_model_repetition_penalty(host_llm, qwen2_hf, prompts):
    defaults = host_llm.get_default_sampling_params()
    assert defaults.repetition_penalty == PENALTY and defaults.max_tokens == NEW_TOKENS
    for prompt, got in zip(prompts, tokens(host_llm, prompts), strict=True):
        # The same generation_config.json: penalty, greedy, max_new_tokens, EOS.
        assert got == hf_generate(qwen2_hf, prompt)
    # The penalty matters for this model: plain greedy differs.
    plain = [hf_generate(qwen2_hf, p, repetition_penalty=1.0) for p in prompts]
    assert plain != [hf_generate(qwen2_hf, p) for p in prompts]


def test_repetition_penalty_equals_transformers(host_llm, qwen2_hf, prompts):
    from vllm import SamplingParams

    # Both stop at EOS (vLLM's default, HF's generation config).
    params = SamplingParams(temperature=0.0, repetition_penalty=1.8, max_tokens=NEW_TOKENS)
    for prompt, got in zip(prompts, tokens(host_llm, prompts, params), strict=True):
        assert got == hf_generate(qwen2_hf, prompt, repetition_penalty=1.8)


def test_presence_and_frequency_penalties_follow_openai(host_llm, qwen2_hf, prompts):
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0, presence_penalty=1.5, frequency_penalty=0.7, max_tokens=NEW_TOKENS, ignore_eos=True
    )
    for prompt, got in zip(prompts, tokens(host_llm, prompts, params), strict=True):
        assert got == hf_openai_penalties(qwen2_hf, prompt, 1.5, 0.7, NEW_TOKENS)


def test_logit_bias_and_allowed_token_ids(host_llm, qwen2_hf, prompts):
    from vllm import SamplingParams

    allowed = [100, 200, 300, 400]
    params = SamplingParams(temperature=0.0, allowed_token_ids=allowed, max_tokens=4, ignore_eos=True)
    got = tokens(host_llm, prompts[:1], params)[0]
    generated: list[int] = []
    with torch.no_grad():
        for _ in range(4):
            logits = qwen2_hf(torch.tensor([prompts[0] + generated])).logits[0, -1]
            generated.append(allowed[int(logits[allowed].argmax())])
    assert got == generated
    params = SamplingParams(temperature=0.0, logit_bias={777: 100.0}, max_tokens=3, ignore_eos=True)
    assert tokens(host_llm, prompts[:1], params)[0] == [777, 777, 777]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (dict(logprob_token_ids=[5]), "logprob_token_ids is not supported by the Neuron plugin"),
        (dict(extra_args={"x": 1}), r"extra_args \['x'\] are not supported by the Neuron plugin \(it reads nothing\)"),
    ],
)
def test_a_field_the_plugin_does_not_list_is_refused(host_llm, prompts, params, message):
    """request_checks lists what it supports: everything else must keep its SamplingParams() default."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=message):
        tokens(host_llm, prompts[:1], SamplingParams(max_tokens=2, **params))


@pytest.mark.slow  # two more engines
def test_seed_makes_unseeded_sampling_reproducible_across_engines(host_dir, prompts):
    from vllm import SamplingParams

    # Unseeded, sampled: drawn from generators seeded by the engine's --seed (make_llm passes seed=0).
    params = SamplingParams(temperature=1.0, top_k=0, max_tokens=8, ignore_eos=True)
    runs = []
    for seed in (0, 0, 1):
        engine = make_llm(host_dir) if seed == 0 else _llm_with_seed(host_dir, seed)
        runs.append(tokens(engine, prompts, params))
        close_llm(engine)
    assert runs[0] == runs[1]
    assert runs[2] != runs[0]


def _llm_with_seed(model, seed: int):
    from vllm import LLM

    return LLM(model=str(model), seed=seed)


def test_device_sampling_artifact_drops_the_defaults_with_a_warning(device_dir, qwen2_hf, prompts, caplog):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    with caplog.at_level(logging.WARNING):
        engine = make_llm(device_dir)
    try:
        assert "the model's generation config sets repetition_penalty=1.3, which this artifact cannot apply" in (
            caplog.text
        )
        assert engine.get_default_sampling_params().repetition_penalty == 1.0
        # A default request is served (greedy from the generation config), without the penalty.
        for prompt, got in zip(prompts, tokens(engine, prompts), strict=True):
            assert got == hf_generate(qwen2_hf, prompt, repetition_penalty=1.0)
        with pytest.raises(VLLMValidationError, match=r"repetition_penalty is not supported \(this artifact samples"):
            tokens(engine, prompts[:1], SamplingParams(repetition_penalty=1.2, max_tokens=2))
    finally:
        close_llm(engine)
