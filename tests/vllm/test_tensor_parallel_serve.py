"""`vllm serve --tensor-parallel-size 3` on SmolLM2-135M-Instruct (9 query heads, 3 KV heads) exported with
tp_degree 3: three vLLM workers, one shard each, answer concurrent greedy chats exactly as transformers does.
A --tensor-parallel-size other than the artifact's is refused at startup with one line.
"""

from __future__ import annotations

import pytest
from support.client import call, concurrently
from support.references import hf_greedy
from support.server import Server, serve
from support.smollm2 import smollm2_hf_and_checkpoint

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

TP = 3
NEW_TOKENS = 10
QUESTIONS = ["What is the capital of France?", "Name a color.", "How many legs does a spider have?"]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    hf, tokenizer, source = smollm2_hf_and_checkpoint(tmp_path_factory.mktemp("smollm2-source"))
    out = tmp_path_factory.mktemp("smollm2-tp3")
    config = NeuronConfig(
        batch_size=2,
        sequence_length=256,
        prefill_chunk_size=64,
        context_buckets=(256,),
        prefill_buckets=(0, 256),
        tp_degree=TP,
    )
    NeuronModelForCausalLM.export(source, config).save_pretrained(out)
    return hf, tokenizer, out


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    log = tmp_path_factory.mktemp("tp-serve") / "server.log"
    yield from serve(smollm2[2], log, "--tensor-parallel-size", str(TP), timeout=900)


def test_concurrent_greedy_chats_equal_transformers(smollm2, server):
    hf, tokenizer, _ = smollm2

    def ask(question: str) -> list[int]:
        body = {
            "model": server.model,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": NEW_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        status, answer = call(server.port, "/v1/chat/completions", body)
        assert status == 200, answer
        return answer["choices"][0]["token_ids"]

    answers = concurrently(ask, QUESTIONS, workers=len(QUESTIONS))  # batch 2: the third waits for a slot
    for question, tokens in zip(QUESTIONS, answers, strict=True):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokens == hf_greedy(hf, prompt, NEW_TOKENS), question
    assert "Paris" in tokenizer.decode(answers[0])


def test_a_tensor_parallel_size_other_than_the_artifacts_is_refused(smollm2, tmp_path):
    refused = Server(smollm2[2], tmp_path / "refused.log", "--tensor-parallel-size", "2")
    assert refused.process.wait(timeout=300) != 0
    log = refused.log_tail()
    assert "tensor_parallel_size=2 does not match the artifact's tp_degree=3" in log, log
