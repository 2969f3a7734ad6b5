"""Top-k / top-p / temperature sampling as tensor ops, with the randomness given as an input.

The graph holds no RNG op: `uniform` [n, 1] is drawn on the host from each request's own
generator, so a seeded request samples the same tokens on any backend.

logit_bias: max_logit_bias (token id, bias) pairs per row, applied to the sampler's candidates (sampler_candidates:
one top-k over the raw logits serves the sampler and the logprobs); logprobs stay the raw logits' (vLLM's
raw_logprobs). min_p is the fourth sampling parameter.

Structured outputs: a packed token bitmask (xgrammar's layout, which vLLM's scheduler sends: bit j of int32 word i
allows token 32 * i + j) masks the logits before sampling (mask_disallowed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .collectives import SINGLE, Collectives
from .masks import MASK_FILL, mask_fill

BITS_PER_WORD = 32


def bitmask_words(vocab_size: int) -> int:
    """int32 words of a packed token bitmask row: ceil(vocab / 32)."""
    return -(-vocab_size // BITS_PER_WORD)


def mask_disallowed(
    logits: torch.Tensor, bitmask: torch.Tensor, vocab_offset: torch.Tensor | None = None
) -> torch.Tensor:
    """logits [n, V_local] with every token the packed bitmask [n, W] int32 disallows set to a finite fill.

    Token t is allowed when bit t % 32 of word t // 32 is set; a row of all ones (-1) changes nothing. The words are
    unpacked whole (a shift by 0..31 and an and: [n, W, 32] bits in token order). Under tensor parallelism the
    logits are a vocabulary slice starting at global id `vocab_offset`, gathered from the unpacked bits; ids past
    the bitmask (padded vocabulary rows) are disallowed. Plain integer ops, so the graph compiles on Neuron; the fill
    is finite as in the attention mask (models/masks.py): a fully masked row stays a number.
    """
    rows, words = bitmask.shape
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)
    bits = torch.bitwise_and(torch.bitwise_right_shift(bitmask[:, :, None], shifts), 1).view(rows, -1)
    local = logits.shape[-1]
    if vocab_offset is None:
        allowed = bits[:, :local]
    else:
        ids = torch.arange(local, dtype=torch.int32, device=logits.device) + vocab_offset.to(torch.int32)
        allowed = bits.index_select(-1, ids.clamp(max=bits.shape[-1] - 1)) * (ids < bits.shape[-1])
    return logits.masked_fill(allowed == 0, mask_fill(logits.dtype))


@dataclass
class Candidates:
    """What the sampler draws from and what the logprobs read, all [n, *] with global token ids.

    values / ids / raw: the sampler's candidates sorted by decreasing (biased) logit, and their raw logits.
    raw_top / raw_top_ids: the largest raw logits in decreasing order (the logprobs' top, and the vocabulary max)."""

    values: torch.Tensor
    ids: torch.Tensor
    raw: torch.Tensor
    raw_top: torch.Tensor
    raw_top_ids: torch.Tensor


def sampler_candidates(
    raw: torch.Tensor,
    max_topk: int,
    bias: tuple[torch.Tensor, torch.Tensor] | None = None,
    cc: Collectives = SINGLE,
    vocab_offset: torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> Candidates:
    """The top max_topk of the logits raw [n, V_local] fp32 plus each row's sparse logit_bias, from one top-k over the
    raw logits: bias = (ids [n, M] int32 global token ids, values [n, M] fp32; unused slots: any id with bias 0),
    vLLM's LogitBiasLogitsProcessor (`logits[rows, ids] += biases`) without a pass over the vocabulary.

    The raw top max_topk + M hold the biased top max_topk of every token without a bias: at most M of them carry one,
    so at least max_topk unbiased ones rank above any token outside them. The tokens with a bias are gathered
    explicitly (a raised one may come from anywhere), each once: a slot whose id is already a raw candidate or an
    earlier slot's drops out (-inf), the others carry the sum of their id's biases. The top max_topk of these
    max_topk + 2M candidates are the sampler's."""
    slots = 0 if bias is None else bias[0].shape[-1]
    raw_top, raw_top_ids = top_candidates(raw, max_topk + slots, cc, vocab_offset, vocab_size)
    k = min(max_topk, raw_top.shape[-1])
    if bias is None:
        return Candidates(raw_top[:, :k], raw_top_ids[:, :k], raw_top[:, :k], raw_top, raw_top_ids)
    ids, raws, values = _with_logit_bias(raw, raw_top, raw_top_ids, bias[0], bias[1].float(), cc, vocab_offset)
    values, order = torch.topk(values, k, dim=-1)
    return Candidates(values, ids.gather(-1, order), raws.gather(-1, order), raw_top, raw_top_ids)


def _with_logit_bias(raw, raw_top, raw_top_ids, bias_ids, bias_values, cc, vocab_offset):
    """The raw candidates then the bias slots: ids, raw logits and biased logits [n, K + M] (duplicate slots -inf).
    The id comparisons are small [n, M, *] 0/1 matrices; the biases are summed over them by matmuls (exact: one
    nonzero term per id, vLLM's logit_bias being a dict)."""
    slots = bias_ids.shape[-1]
    same = (bias_ids[:, :, None] == bias_ids[:, None, :]).float()  # [n, M, M]
    in_top = (bias_ids[:, :, None] == raw_top_ids[:, None, :]).float()  # [n, M, K]
    earlier = torch.ones(slots, slots, device=raw.device).tril(-1)
    duplicate = ((same * earlier).sum(dim=-1) + in_top.sum(dim=-1)) > 0
    slot_raw = gather_global(raw, bias_ids, cc, vocab_offset)
    slot_values = (slot_raw + (same @ bias_values[:, :, None]).squeeze(-1)).masked_fill(duplicate, float("-inf"))
    top_values = raw_top + (bias_values[:, None, :] @ in_top).squeeze(1)
    return (
        torch.cat((raw_top_ids, bias_ids), dim=-1),
        torch.cat((raw_top, slot_raw), dim=-1),
        torch.cat((top_values, slot_values), dim=-1),
    )


def sample(
    logits: torch.Tensor,
    params: torch.Tensor,
    uniform: torch.Tensor,
    max_topk: int,
    cc: Collectives = SINGLE,
    vocab_offset: torch.Tensor | None = None,
    vocab_size: int | None = None,
    running_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    bias: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """logits [n, V], params [n, 4] = (top_k, top_p, temperature, min_p), uniform [n, 1] in [0, 1) -> token ids [n].

    top_k is clamped to [1, max_topk]; greedy is top_k 1 (rank 0 is the argmax). `bias`: each row's logit_bias
    pairs (sampler_candidates).
    Under tensor parallelism `logits` are this rank's vocabulary slice, starting at global id `vocab_offset`:
    each rank's top k (with global ids) is all-gathered and the global top k is taken among them, so every
    rank holds the same candidates and, given the same `uniform`, samples the same token.
    `running_sum` (default: triangular_running_sum(k), for the graphs) computes the running sums of the
    candidates' probabilities; the host sampler passes a torch.cumsum.
    """
    candidates = sampler_candidates(logits.float(), max_topk, bias, cc, vocab_offset, vocab_size)
    running_sum = running_sum or triangular_running_sum(candidates.values.shape[-1], logits.device)
    choice = _choose(candidates.values, params, uniform, running_sum)
    return candidates.ids.gather(-1, choice).squeeze(-1)


def sample_with_logprobs(
    logits: torch.Tensor,
    params: torch.Tensor,
    uniform: torch.Tensor,
    max_topk: int,
    num_logprobs: int,
    cc: Collectives = SINGLE,
    vocab_offset: torch.Tensor | None = None,
    vocab_size: int | None = None,
    bias: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sample(), with vLLM's raw logprobs (log-softmax of `logits` before logit_bias, temperature, top-k, top-p),
    laid out as vLLM's LogprobsTensors: token ids [n, 1 + num_logprobs] int32 (the sampled token, then the top
    num_logprobs), their logprobs [n, 1 + num_logprobs] fp32, and the sampled token's rank [n] int32 (tokens whose
    logprob is at least its own: 1 for the most likely).

    The top num_logprobs and the sampled token's raw logit come with the candidates (num_logprobs <= max_topk), and
    so does the vocabulary's max: the log-sum-exp is one shifted sum over the vocabulary, the rank one count. Under
    tensor parallelism each rank's partial sum and count are all-gathered and added.
    """
    raw = logits.float()
    candidates = sampler_candidates(raw, max_topk, bias, cc, vocab_offset, vocab_size)
    running_sum = triangular_running_sum(candidates.values.shape[-1], raw.device)
    choice = _choose(candidates.values, params, uniform, running_sum)
    chosen_ids, chosen = candidates.ids.gather(-1, choice), candidates.raw.gather(-1, choice)
    top, top_ids = candidates.raw_top[:, :num_logprobs], candidates.raw_top_ids[:, :num_logprobs]
    ids = torch.cat((chosen_ids, top_ids), dim=-1)
    normalizer = log_sum_exp(raw, candidates.raw_top[:, :1], candidates.raw_top_ids[:, :1], cc)
    logprobs = torch.cat((chosen, top), dim=-1) - normalizer
    at_least = (raw >= chosen).sum(dim=-1, keepdim=True, dtype=torch.int32)
    ranks = cc.all_gather_last(at_least.float()).sum(dim=-1).to(torch.int32)
    return ids, logprobs, ranks


def gather_global(
    values: torch.Tensor, ids: torch.Tensor, cc: Collectives = SINGLE, vocab_offset: torch.Tensor | None = None
) -> torch.Tensor:
    """values [n, V_local] at global token ids [n, m] int32 -> [n, m]: under tensor parallelism the rank holding each
    id contributes it, the others 0, summed over the ranks. An index_select of the flattened values, which takes
    int32 indices (gather needs int64, emulated on NeuronCores)."""
    rows, local = values.shape
    if cc.degree > 1:
        ids = ids - vocab_offset.to(torch.int32)
        inside = (ids >= 0) & (ids < local)
        ids = ids.clamp(0, local - 1)
    row_starts = torch.arange(rows, dtype=torch.int32, device=values.device)[:, None] * local
    picked = values.reshape(-1).index_select(0, (ids + row_starts).view(-1)).view(ids.shape)
    if cc.degree == 1:
        return picked
    return cc.all_gather_last(picked * inside).view(rows, cc.degree, -1).sum(dim=1)


def log_sum_exp(
    values: torch.Tensor, maximum: torch.Tensor, argmax: torch.Tensor, cc: Collectives = SINGLE
) -> torch.Tensor:
    """values [n, V_local] fp32 -> log(sum(exp(values))) over the whole vocabulary [n, 1], given its max [n, 1] and
    the max's global id [n, 1] (the same on every rank). One rank: the max minus its log-softmax (one fused pass,
    where the shifted sum takes three); tensor parallel: each rank's shifted sum, added over the ranks."""
    if cc.degree == 1:
        return maximum - gather_global(torch.log_softmax(values, dim=-1), argmax)
    local_sum = torch.exp(values - maximum).sum(dim=-1, keepdim=True)
    return maximum + torch.log(cc.all_gather_last(local_sum).sum(dim=-1, keepdim=True))


def top_candidates(
    values: torch.Tensor,
    max_topk: int,
    cc: Collectives = SINGLE,
    vocab_offset: torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The max_topk largest logits [n, k] fp32 in decreasing order and their (global) token ids [n, k] int32."""
    k = min(max_topk, values.shape[-1])
    top_values, top_ids = torch.topk(values, k, dim=-1)
    top_ids = top_ids.to(torch.int32)
    if cc.degree > 1:
        global_ids = top_ids + vocab_offset.to(torch.int32)
        top_values, global_ids = cc.all_gather_last(top_values), cc.all_gather_last(global_ids)
        k = min(max_topk, vocab_size)
        top_values, order = torch.topk(top_values, k, dim=-1)
        top_ids = global_ids.gather(-1, order)
    return top_values, top_ids


def triangular_running_sum(k: int, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """[n, k] -> running sums along k, as a matmul with a triangular matrix, not torch.cumsum (neuronx-cc has a
    history of cumsum failures): upper[i, j] = 1 where i <= j, so (p @ upper)[j] = p[0] + ... + p[j].
    The matrix is k x k, built once per call: fine for max_topk candidates, not for a whole vocabulary."""
    ranks = torch.arange(k, dtype=torch.int32, device=device)[None, :]
    upper = (ranks >= ranks.T).float()
    return lambda probs: probs @ upper


def sorted_probs(top_values, params, running_sum) -> torch.Tensor:
    """The unnormalised probabilities [n, k] the sampler draws from, over candidates sorted by decreasing logit:
    temperature, min_p and top-k, then top-p (0 past the nucleus). The host's speculative acceptance uses them too.

    min_p is vLLM's MinPLogitsProcessor on the temperature-scaled logits: a token whose probability is below min_p
    times the most likely one's is dropped, i.e. scaled - scaled_max < log(min_p) (min_p 0: log 0 = -inf, none).
    Both min_p and top-k drop a tail of the sorted candidates, so top-p sees their intersection, as in vLLM."""
    k = top_values.shape[-1]
    top_k, top_p, temperature, min_p = params[:, 0:1], params[:, 1:2], params[:, 2:3], params[:, 3:4]
    ranks = torch.arange(k, dtype=torch.int32, device=top_values.device)[None, :]
    scaled = top_values / temperature
    below_min_p = scaled - scaled[:, :1] < torch.log(min_p)
    scaled = scaled.masked_fill((ranks >= top_k) | below_min_p, MASK_FILL)
    probs = torch.softmax(scaled, dim=-1)
    # Keep a rank while the mass strictly before it is below top_p: rank 0 is always kept.
    keep = (running_sum(probs) - probs) < top_p
    return probs * keep


def _choose(top_values, params, uniform, running_sum) -> torch.Tensor:
    """The index [n, 1] of the sampled candidate among candidates sorted by decreasing logit: values [n, k]."""
    k = top_values.shape[-1]
    probs = sorted_probs(top_values, params, running_sum)
    cdf = running_sum(probs)
    return (cdf < uniform * cdf[:, -1:]).sum(dim=-1, keepdim=True).clamp(max=k - 1)
