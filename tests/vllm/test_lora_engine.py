"""vLLM's LoRA interface on an export with LoRA slots (in-process vllm.LLM): requests of one batch each on their own
adapter (or the base model) give the greedy tokens of transformers + peft; a third adapter swaps into a slot the
least recently used one gives up; --max-loras / --max-lora-rank beyond the export and bad adapters are refused."""

from __future__ import annotations

import pytest
from support.engine import close_llm, make_llm, serve_config
from support.lora import make_adapter
from support.references import hf_greedy
from support.served import CHUNK, LORA_RANK, prompt_of

pytestmark = pytest.mark.slow  # an in-process vLLM engine
pytest.importorskip("peft")

RANK = LORA_RANK
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def adapters(lora_adapters):
    return lora_adapters


@pytest.fixture(scope="module")
def llm(lora_dir):
    engine = make_llm(lora_dir, enable_lora=True, max_loras=2, max_lora_rank=RANK, max_cpu_loras=3)
    yield engine
    close_llm(engine)


def lora_request(adapters, name: str):
    from vllm.lora.request import LoRARequest

    return None if name is None else LoRARequest(name, list(adapters).index(name) + 1, str(adapters[name][0]))


def generate(llm, adapters, prompts, names) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    requests = [lora_request(adapters, name) for name in names]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=requests, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_each_request_runs_its_adapter_and_a_third_swaps_in(llm, adapters, tokenizer, tiny_hf):
    """A batch of the base model and both slots' adapters, then one naming the third adapter (no free slot: the
    least recently used adapter no live request runs is dropped from its slot) next to the first; a prompt longer
    than a chunk (its chunks run next to decodes: chunk_and_decode) on each."""
    prompts = [prompt_of(n, tokenizer, offset=i) for i, n in enumerate((9, 2 * CHUNK + 3, 12, 20))]
    batches = [
        (prompts[:3], [None, "first", "second"]),
        (prompts[1:], ["third", "first", None]),
    ]
    for batch, names in batches:
        served = generate(llm, adapters, batch, names)
        for prompt, name, tokens in zip(batch, names, served, strict=True):
            reference = tiny_hf if name is None else adapters[name][1]
            assert tokens == hf_greedy(reference, prompt, NEW_TOKENS), name


def test_same_prompt_on_two_adapters_never_shares_a_prefix(llm, adapters, tokenizer, tiny_hf):
    """Prefix caching is on: vLLM's block hash holds the adapter, so a prompt cached on one adapter is computed
    again on another."""
    prompt = prompt_of(3 * CHUNK, tokenizer, offset=7)
    for names in (["first"], ["second"], [None], ["first"]):
        (tokens,) = generate(llm, adapters, [prompt], names)
        reference = tiny_hf if names[0] is None else adapters[names[0]][1]
        assert tokens == hf_greedy(reference, prompt, NEW_TOKENS), names


def test_bad_adapters_are_refused_and_the_engine_keeps_serving(llm, adapters, vllm_root, tiny_hf, tokenizer):
    from vllm.lora.request import LoRARequest

    make_adapter(tiny_hf, vllm_root / "adapters" / "wide", 9, 2 * RANK, ["q_proj"])
    with pytest.raises(Exception, match=f"rank {2 * RANK} exceeds this export's max_lora_rank {RANK}"):
        llm.llm_engine.add_lora(LoRARequest("wide", 9, str(vllm_root / "adapters" / "wide")))
    with pytest.raises(Exception, match="No adapter found for"):
        llm.llm_engine.add_lora(LoRARequest("missing", 10, str(vllm_root / "nowhere")))
    prompt = prompt_of(10, tokenizer, offset=3)
    # vllm.LLM hands a request's adapter to the engine with the request: an unreadable one fails that request alone.
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    ghost = LoRARequest("ghost", 11, str(vllm_root / "nowhere"))
    requests = [{"prompt_token_ids": prompt}] * 2
    outputs = llm.generate(requests, params, lora_request=[ghost, lora_request(adapters, "first")], use_tqdm=False)
    assert outputs[0].outputs[0].finish_reason == "error", outputs[0]
    assert list(outputs[1].outputs[0].token_ids) == hf_greedy(adapters["first"][1], prompt, NEW_TOKENS)
    assert generate(llm, adapters, [prompt], ["first"])[0] == hf_greedy(adapters["first"][1], prompt, NEW_TOKENS)


def test_more_slots_or_a_larger_rank_than_exported_are_refused(lora_dir):
    with pytest.raises(ValueError, match="--max-loras 3 exceeds the export's 2 LoRA slots: pass at most those, or "):
        serve_config(lora_dir, enable_lora=True, max_loras=3)
    with pytest.raises(ValueError, match="--max-lora-rank 16 exceeds the export's max_lora_rank 8: .* --max-loras 2 "):
        serve_config(lora_dir, enable_lora=True, max_lora_rank=16)
    serve_config(lora_dir, enable_lora=True, max_loras=2, max_lora_rank=RANK)  # what the export holds: accepted


def test_an_adapter_read_while_the_others_fill_the_slots_gets_one(lora_dir, adapters, tokenizer):
    """The runner's slots with vLLM's default host cache (--max-cpu-loras = --max-loras = 2): both adapters sit in
    slots when a request names a third; it is read and kept (never trimmed before its copy), and takes the least
    recently used slot no live request runs, with peft's tokens."""
    import torch

    from optimum_neuron_plugin import NeuronModelForCausalLM
    from optimum_neuron_plugin.vllm.runner.lora_slots import LoraSlots

    model = NeuronModelForCausalLM.from_pretrained(lora_dir)
    slots = LoraSlots(model, max_cpu_loras=2)
    first, second, third = (lora_request(adapters, name) for name in ("first", "second", "third"))
    assert [slots.slot(first, []), slots.slot(second, [])] == [1, 2]
    assert slots.slot(third, [second.lora_int_id]) == 1  # first's slot: least recently used, not live
    name = {slot: name for name, slot in model.adapters.items()}[1]
    prompt = prompt_of(9, tokenizer, offset=2)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, eos_token_id=[], adapters=[name])
    assert out[0, len(prompt) :].tolist() == hf_greedy(adapters["third"][1], prompt, NEW_TOKENS)
