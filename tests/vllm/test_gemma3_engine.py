"""Gemma 3 270M (the Q4_K_M GGUF from PyPI, support.gemma3) end to end: exported from the model transformers reads
from the GGUF, its greedy text equals transformers' (fed <bos> + the prompt) through vllm.LLM given plain text, and
through the runtime the engine loaded (the first prompt).

The GGUF is dequantized once: the reference model and its GGUF-built tokenizer are saved as a Hugging Face directory,
the export's source (exporting from a .gguf file itself: tests/cli/test_export.py, SmolLM2).

One export for the module: batch 2, sequence_length 1024, chunk 128, one context bucket (1024), 2-row decode graphs.
The long prompt runs past the 512-token sliding window, so the sliding layers read only their window of the cache.
The exported tokenizer adds <bos> (the one transformers builds from the GGUF does not): vLLM users get the model's
real quality from plain prompts.
"""

from __future__ import annotations

import pytest
import torch
from support.engine import close_llm, hf_greedy_cached, make_llm
from support.gemma3 import gemma3_hf, save_gemma3_hf

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

NEW_TOKENS = 16
BOS = 2
PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    # ~600 tokens: past the sliding window (512).
    "Notes on rivers. "
    + " ".join(f"River {i} flows north and then turns east towards the sea." for i in range(45))
    + " The first river mentioned in these notes is",
]
# Three prior-context buckets instead of the default seven: chunks attend up to 512 or 1024 prior positions. One
# context bucket and decode graphs of 2 rows only (a lone request runs in one of their rows): 5 graphs of the model's
# 262k-token vocabulary (the bucket ladder, and a window read whole from buckets below it: tests/core/test_gemma3.py).
SHAPE = dict(
    batch_size=2,
    sequence_length=1024,
    prefill_chunk_size=128,
    context_buckets=(1024,),
    prefill_buckets=(0, 512, 1024),
    decode_batch_sizes=(2,),
)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    hf, gguf_tokenizer = gemma3_hf()
    source = save_gemma3_hf(hf, gguf_tokenizer, tmp_path_factory.mktemp("gemma3-hf"))
    out = tmp_path_factory.mktemp("gemma3-exported")
    NeuronModelForCausalLM.export(source, NeuronConfig(**SHAPE)).save_pretrained(out)
    return hf, gguf_tokenizer, out, source


@pytest.fixture(scope="module")
def references(gemma3):
    """HF greedy tokens after <bos> + each prompt (the GGUF tokenizer does not add <bos>)."""
    hf, gguf_tokenizer, _, _ = gemma3
    ids = [[BOS] + gguf_tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    assert len(ids[2]) > 512
    return ids, [hf_greedy_cached(hf, i, NEW_TOKENS) for i in ids]


def test_the_gguf_tokenizer_lacks_bos_the_exported_one_adds_it(gemma3):
    from transformers import AutoTokenizer

    _, gguf_tokenizer, out, source = gemma3
    assert gguf_tokenizer("Hello")["input_ids"][0] != BOS
    assert AutoTokenizer.from_pretrained(source)("Hello")["input_ids"][0] != BOS  # the export's source lacks it too
    assert AutoTokenizer.from_pretrained(out)("Hello")["input_ids"][0] == BOS


@pytest.fixture(scope="module")
def llm(gemma3):
    """The in-process engine: its worker loads the export with NeuronModelForCausalLM.from_pretrained, the runtime
    the runtime test drives through vLLM's LLM.apply_model (one load and warm-up of the 262k-vocabulary graphs)."""
    engine = make_llm(gemma3[2])
    yield engine
    close_llm(engine)


def test_vllm_greedy_text_equals_transformers(gemma3, references, llm):
    from vllm import SamplingParams

    _, gguf_tokenizer, _, _ = gemma3
    ids, expected = references
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt_ids, tokens, output in zip(ids, expected, outputs, strict=True):
        assert list(output.prompt_token_ids) == prompt_ids  # vLLM's tokenization adds <bos>
        assert list(output.outputs[0].token_ids) == tokens
        assert output.outputs[0].text == gguf_tokenizer.decode(tokens, skip_special_tokens=True)


def test_runtime_greedy_equals_transformers(gemma3, references, llm):
    """The runtime's tokenizer adds <bos> to every prompt; its greedy text of the first one (the vLLM test runs all
    three through the same graphs). After the vLLM test: generate writes the cache of slot 0, behind the engine's
    back, when the engine has nothing left to serve."""
    ids, expected = references

    def tokenize_and_generate(model: NeuronModelForCausalLM) -> tuple[list[list[int]], list[int], str]:
        assert isinstance(model, NeuronModelForCausalLM)
        generated = model.generate(torch.tensor([ids[0]]), max_new_tokens=NEW_TOKENS, eos_token_id=[])
        prompt_ids = [model.tokenizer(prompt)["input_ids"] for prompt in PROMPTS]
        return prompt_ids, generated[0, len(ids[0]) :].tolist(), model.tokenizer.decode(expected[0])

    ((prompt_ids, tokens, text),) = llm.apply_model(tokenize_and_generate)
    assert prompt_ids == ids
    assert tokens == expected[0], text
    # With <bos> the model writes text (" the capital of the country of France. It is the largest city in France
    # and"), not one word repeated.
    assert len(set(expected[0])) > NEW_TOKENS // 2 and "France" in text
