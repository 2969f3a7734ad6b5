"""Hugging Face style generate() on top of the chunk loop and decode steps: the first token sampled on the host from
the prompt's logits, the rest by the decode graph."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import InputError
from ..sampling import GREEDY, SamplingParams, host_topk, make_generator, sample_on_host
from .chunk_loop import prefill_batch
from .decode import checked_batch, decode
from .graph_set import GraphSet
from .ranks import from_rank0


def generate(
    gs: GraphSet,
    default_eos: list[int],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 20,
    do_sample: bool = False,
    top_k: int = 50,
    top_p: float = 1.0,
    temperature: float = 1.0,
    seed: int | None = None,
    eos_token_id: int | list[int] | None = None,
    adapters: Sequence[str | None] | None = None,
) -> torch.Tensor:
    """Prompt plus new tokens per row, right-padded with the first eos id once a row stops. adapters: each row's
    LoRA adapter by name (None: the base model)."""
    prompts = _prompts(input_ids, attention_mask)
    nc = gs.neuron_config
    if len(prompts) > nc.batch_size:
        raise InputError(
            f"generate got {len(prompts)} sequences; the model was compiled for batch_size {nc.batch_size}"
        )
    adapters = [None] * len(prompts) if adapters is None else list(adapters)
    if len(adapters) != len(prompts):
        raise InputError(f"generate got {len(adapters)} adapters for {len(prompts)} sequences: give one per row")
    slots = [gs.adapters.slot(name) for name in adapters]  # each checked before anything runs
    try:
        for seq_id, slot in enumerate(slots):
            gs.adapters.of_seq[seq_id] = slot
        return _generate(gs, default_eos, prompts, input_ids, attention_mask, max_new_tokens, do_sample, top_k,
                         top_p, temperature, seed, eos_token_id)  # fmt: skip
    finally:
        gs.adapters.of_seq[: len(prompts)] = 0


def _generate(
    gs, default_eos, prompts, input_ids, attention_mask, max_new_tokens, do_sample, top_k, top_p, temperature, seed,
    eos_token_id,
) -> torch.Tensor:  # fmt: skip
    nc = gs.neuron_config
    eos = _eos_ids(eos_token_id, default_eos)
    params = SamplingParams(top_k, top_p, temperature) if do_sample else GREEDY
    generators = [
        make_generator(None if seed is None else seed + i) if do_sample else None for i in range(len(prompts))
    ]
    for slot, prompt in enumerate(prompts):
        if len(prompt) >= nc.sequence_length:
            raise InputError(
                f"prompt {slot} has {len(prompt)} tokens; sequence_length {nc.sequence_length} leaves no room to "
                "generate: shorten it or export with a larger --sequence-length"
            )
    outputs: list[list[int]] = []
    for slot, prompt in enumerate(prompts):
        logits = prefill_batch(gs, [(slot, prompt, 0)])[0]
        cap = host_topk(nc.on_device_sampling, nc.max_topk)
        first = from_rank0(gs.group, sample_on_host(logits[None], [params], [generators[slot]], cap))
        outputs.append([int(first[0])])
    live = [i for i in range(len(prompts)) if outputs[i][-1] not in eos and max_new_tokens > 1]
    while live:
        positions = [len(prompts[i]) + len(outputs[i]) - 1 for i in live]
        batch = checked_batch(
            gs, live, [outputs[i][-1] for i in live], positions, [params] * len(live), [generators[i] for i in live]
        )
        result = decode(gs, batch)
        for i, token in zip(live, result.tokens, strict=True):
            outputs[i].append(token)
        live = [
            i for i in live
            if outputs[i][-1] not in eos and len(outputs[i]) < max_new_tokens
            and len(prompts[i]) + len(outputs[i]) < nc.sequence_length
        ]  # fmt: skip
    return _pad_outputs(input_ids, prompts, outputs, eos[0] if eos else 0, attention_mask)


def _prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask)
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    if any(not p for p in prompts):
        raise InputError("generate got an empty prompt")
    return prompts


def _eos_ids(eos_token_id: int | list[int] | None, default: list[int]) -> list[int]:
    if eos_token_id is None:
        return list(default)
    return [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)


def _pad_outputs(input_ids, prompts, outputs, pad_id, attention_mask) -> torch.Tensor:
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    width = max(len(o) for o in outputs)
    new = torch.full((len(outputs), width), pad_id, dtype=ids.dtype)
    for i, tokens in enumerate(outputs):
        new[i, : len(tokens)] = torch.tensor(tokens)
    return torch.cat((ids, new), dim=1)
