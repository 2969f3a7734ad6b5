"""What the tests compare against: Hugging Face transformers in fp32, and this plugin's own runtime."""

from __future__ import annotations

import pytest
import torch

from optimum_neuron_plugin import NeuronModelForCausalLM


def hf_greedy(hf: torch.nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    """The new tokens of HF `generate`, greedy, fp32, no logits processors, never stopping on EOS
    (EOS is a token like any other, as with vLLM's ignore_eos)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def hf_last_logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """fp32 logits [vocab] of the next token after `tokens`."""
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0, -1].float()


def hf_next_logits(hf: torch.nn.Module, sequences: list[list[int]]) -> torch.Tensor:
    """fp32 logits [n, length, vocab] after every prefix of n sequences of the same length."""
    with torch.no_grad():
        return hf(torch.tensor(sequences)).logits.float()


def runtime_greedy(model: NeuronModelForCausalLM, prompt: list[int], new_tokens: int) -> list[int]:
    """This plugin's `generate`, greedy, EOS disabled: the new tokens only."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, eos_token_id=[])
    return out[0, len(prompt) :].tolist()


TIE = 1e-5  # logprobs this close may rank either way between two implementations' fp32 arithmetic


def assert_prompt_logprobs_are_hf(output, prompt: list[int], num: int, tiny_hf) -> None:
    """vLLM's prompt logprobs: None for the first token, then per position the prompt token's raw logprob and rank
    and the top `num`, in order, from HF's log-softmax of the previous position's logits."""
    with torch.no_grad():
        expected = torch.log_softmax(tiny_hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    entries = output.prompt_logprobs
    assert len(entries) == len(prompt) and entries[0] is None
    for position, entry in enumerate(entries[1:]):
        row, token = expected[position], prompt[position + 1]
        top = torch.topk(row, num).indices.tolist()
        assert set(entry) == {token, *top}
        # Its rank among HF's logits, up to ties within fp32 rounding of the two implementations' logits.
        higher, tied = int((row > row[token] + TIE).sum()), int((row >= row[token] - TIE).sum())
        assert higher + 1 <= entry[token].rank <= tied
        assert [entry[t].rank for t in top] == list(range(1, num + 1))
        for token_id, logprob in entry.items():
            assert logprob.logprob == pytest.approx(float(row[token_id]), abs=1e-4)
