"""The compiled graphs: one fixed-shape program per graph kind and context bucket, sharing the
weights and the KV cache.

- chunked_prefill  : 1 sequence x C tokens -> logits [1, V] of the last real token (no sampling); with
                     prefill_batch_size P > 1 also n sequences x C tokens -> logits [n, V] for every n in 2..P:
                     one chunk of n prompts, no padding rows
- prompt_logits    : 1 sequence x C tokens -> logits [C, V] of every position of the chunk (exports with
                     prompt_logprobs: requests asking for prompt logprobs are prefilled on it, per prefill bucket)
- context_encoding : 1 sequence x S tokens -> logits [1, V] (only when prefill_chunk_size is 0)
- token_generation : n sequences x 1 token -> token ids [n] (on-device sampling) or logits [n, V], for every n in
                     decode_batch_sizes (1 and B by default): a decode call runs the smallest n that holds it.
                     On-device sampling takes a packed token bitmask [n, ceil(V / 32)] int32 too (structured
                     outputs: models.sampling.mask_disallowed); rows without a grammar are all ones. With
                     max_logprobs > 0 it returns, instead of token ids, vLLM's LogprobsTensors of the sampled
                     tokens: ids [n, 1 + max_logprobs] int32 (the sampled token first, then the top max_logprobs),
                     their raw logprobs [n, 1 + max_logprobs] fp32 and the sampled token's rank [n] int32.
                     With max_logit_bias M > 0 it takes each row's logit_bias as M (token id, bias) pairs too:
                     ids [n, M] int32 and biases [n, M] fp32, added to the masked logits' top-k candidates and to
                     the biased ids (models.sampling.sampler_candidates)
- chunk_and_decode : one chunked_prefill chunk and one token_generation batch in a single pass over the
                     weights -> (chunk logits [1, V], token ids [B] or the 3 logprobs tensors) or logits
                     [1 + B, V]. It is how a prompt
                     is prefilled while other requests decode without stalling them or paying for a second
                     call (chunked exports with batch_size > 1)
- tail graphs      : with prefill_tail_size T, chunked_prefill (1 sequence) and chunk_and_decode again with a
                     T-token chunk: a prompt's last piece of at most T tokens (the question after a prefix-cache
                     hit) costs a T-token call instead of a whole chunk's. Files chunked_prefill_tT_L,
                     chunk_and_decode_tT_L
- verify           : n sequences x (k + 1) tokens -> logits [n, k + 1, V] of every position (speculative decoding,
                     k = speculative_tokens): each row's last sampled token and its k draft tokens, written at the
                     row's own positions and attended causally; the host accepts drafts from the logits
                     (draft_acceptance.py). For every n in decode_batch_sizes; a row with fewer drafts repeats its last
                     real token and position (the actual-token mask)
- copy_prefix      : source block table [blocks], destination block table [blocks] -> the blocks covering positions
                     [0, L) of every layer's K and V copied onto the destination's, in place (prefix caching: a
                     prefix held by a busy slot is copied into a new request's blocks). No collectives: under tensor
                     parallelism each rank copies its own KV heads. Chunked exports with NeuronConfig.prefix_copy (the
                     Python API's copy_prefix; under vLLM requests share cached blocks instead)

Each kind is compiled once per bucket L: that graph reads only cache positions [0, L).
- chunked_prefill and prompt_logits, per prefill bucket (NeuronConfig.prefill_buckets, starting at 0): a chunk attends the prior
  context [0, start) in the bucket and its own block causally (models/attention.py, attend_chunk), so a chunk
  starting at s runs the smallest bucket >= s; the bucket-0 graph runs first chunks, which attend only themselves.
- token_generation, per decode bucket (NeuronConfig.decode_buckets, by default the context buckets): its rows
  attend cache positions [0, L) up to themselves, so a call runs the smallest bucket > its largest position.
- the others, per context bucket (NeuronConfig.context_buckets): verify rows and context_encoding attend cache
  positions [0, L) up to themselves, so a call runs the smallest bucket > its largest position; chunk_and_decode's
  chunk attends its prior in the same bucket (start <= L) and its own block; a copy of n positions runs the
  smallest bucket >= n.
The graph that runs a call (its rows and bucket) is picked in one place: runtime/graph_select.py. What each kind
takes per call: graph_inputs.py.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from .config import NeuronConfig
from .graph_inputs import (
    ChunkAndDecodeInputs,
    CopyInputs,
    DecodeInputs,
    GraphInputs,
    RowsInputs,
    SamplingInputs,
    flat,
)
from .graph_spec import (  # noqa: F401 - the graph kinds, also imported from here
    CHUNK_AND_DECODE,
    CHUNKED_PREFILL,
    CONTEXT_ENCODING,
    COPY_PREFIX,
    PREFILL_CHUNKS,
    PROMPT_LOGITS,
    TOKEN_GENERATION,
    VERIFY,
    GraphSpec,
)
from .models import kv_cache
from .models.args import ModelArgs
from .models.collectives import SINGLE, Collectives
from .models.decoder import groups_logits
from .models.layers import rope_inv_freq
from .models.lora import LoraRows
from .models.sampling import bitmask_words, mask_disallowed, sample, sample_with_logprobs
from .models.sharding import VOCAB_OFFSET


def graph_specs(neuron_config: NeuronConfig, vocab_size: int) -> list[GraphSpec]:
    """Every graph of an export; vocab_size is the model's (the token bitmask input's width)."""
    nc = neuron_config
    words = bitmask_words(vocab_size) if nc.on_device_sampling and nc.token_bitmask else 0
    logprobs = nc.max_logprobs if nc.on_device_sampling else 0
    bias = nc.max_logit_bias if nc.on_device_sampling else 0
    specs = []
    for bucket in nc.prefill_buckets:
        for width in range(1, nc.prefill_batch_size + 1):
            specs.append(GraphSpec(CHUNKED_PREFILL, width, nc.prefill_length, samples=False, bucket=bucket))
        if nc.prompt_logprobs:
            specs.append(GraphSpec(PROMPT_LOGITS, 1, nc.prefill_length, samples=False, bucket=bucket))
        if nc.prefill_tail_size:
            specs.append(GraphSpec(CHUNKED_PREFILL, 1, nc.prefill_tail_size, samples=False, bucket=bucket, tail=True))
    for bucket in nc.decode_buckets:
        for rows in nc.decode_batch_sizes:
            narrow = rows < nc.batch_size
            specs.append(
                GraphSpec(
                    TOKEN_GENERATION, rows, 1, nc.on_device_sampling, bucket, narrow=narrow, bitmask_words=words,
                    logprobs=logprobs, logit_bias=bias,
                )
            )  # fmt: skip
    for bucket in nc.context_buckets:
        if not nc.chunked:
            specs.append(GraphSpec(CONTEXT_ENCODING, 1, nc.prefill_length, samples=False, bucket=bucket))
        if nc.chunked and nc.batch_size > 1:
            for chunk in (nc.prefill_length, nc.prefill_tail_size):
                if chunk:
                    specs.append(
                        GraphSpec(
                            CHUNK_AND_DECODE, nc.batch_size, 1, nc.on_device_sampling, bucket, chunk,
                            bitmask_words=words, logprobs=logprobs, logit_bias=bias, tail=chunk != nc.prefill_length,
                        )
                    )  # fmt: skip
        if nc.speculative_tokens:
            for rows in nc.decode_batch_sizes:
                tokens = nc.speculative_tokens + 1
                specs.append(GraphSpec(VERIFY, rows, tokens, samples=False, bucket=bucket, narrow=rows < nc.batch_size))
        if nc.prefix_copy:
            specs.append(GraphSpec(COPY_PREFIX, 1, 0, samples=False, bucket=bucket))
    return [replace(spec, blocks=nc.blocks_per_sequence, lora=nc.lora and spec.name != COPY_PREFIX) for spec in specs]


class DecoderGraph(nn.Module):
    """forward(params, caches, *inputs): the flattened inputs of the graph's kind (graph_inputs.py; inputs_class).
    Returns logits, or with on-device sampling the token ids (spec.logprobs 0) or the (ids, logprobs, ranks) tensors,
    after chunk_and_decode's chunk logits.

    Under tensor parallelism `args` is one rank's shard (models.sharding.local_args) and `cc` names the group:
    the same program serves every rank (rank-specific values such as the vocabulary offset are weights)."""

    def __init__(self, args: ModelArgs, spec: GraphSpec, max_topk: int, cc: Collectives = SINGLE) -> None:
        super().__init__()
        self.args, self.spec, self.max_topk, self.cc = args, spec, max_topk, cc
        # Attention, norms and gated activations run through the ops onp::chunk_attention, onp::decode_attention,
        # onp::rms_norm and onp::gated_activation, whose kernels a backend registers: set by the backend that exports
        # the graph (the CPU backend's programs), else the plain forms every compiler takes.
        self.kernel_ops = False
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=True)
        self.register_buffer("sliding_inv_freq", rope_inv_freq(args, sliding=True), persistent=True)

    def forward(self, params, caches, *tensors):
        inputs = inputs_class(self.spec).unflat(self.spec, iter(tensors))
        if isinstance(inputs, CopyInputs):
            return self._copy_prefix(caches, inputs)
        rows = [inputs.chunk, inputs.rows] if isinstance(inputs, ChunkAndDecodeInputs) else [inputs.rows]
        groups = [(r.ids, r.positions, r.block_tables) for r in rows]
        lora = LoraRows([r.adapters for r in rows], [tuple(r.ids.shape) for r in rows]) if self.spec.lora else None
        chunks = 1 if self.spec.chunk or self.spec.name in PREFILL_CHUNKS else 0
        every = self.spec.name in (VERIFY, PROMPT_LOGITS)
        logits = groups_logits(
            self.args, params, caches, self.inv_freq, groups, self.spec.bucket, self.cc, self.sliding_inv_freq, chunks,
            every_column=every, kernel_ops=self.kernel_ops, lora=lora,
        )  # fmt: skip
        if self.spec.name == VERIFY:
            return self._whole(logits).view(self.spec.rows, self.spec.tokens, -1)
        if not self.spec.samples:
            return self._whole(logits)
        prompt, batch = (logits[:1], logits[1:]) if self.spec.chunk else (None, logits)
        offset, vocab = params.get(VOCAB_OFFSET), self.args.vocab_size
        sampled = sample_rows(self.spec, batch, inputs.sampling, self.max_topk, self.cc, offset, vocab)
        if prompt is None:
            return sampled
        return (self._whole(prompt), *sampled) if self.spec.logprobs else (self._whole(prompt), sampled)

    def _copy_prefix(self, caches, inputs: CopyInputs) -> torch.Tensor:
        """copy_prefix: the blocks covering the bucket, every layer's K and V; returns the destination blocks (a
        graph returns a tensor)."""
        width = kv_cache.table_width(self.spec.bucket, caches[0].shape[1])
        source, destination = inputs.source[:width], inputs.destination[:width]
        for cache in caches:
            kv_cache.copy_blocks(cache, source, destination)
        return destination.clone()

    def _whole(self, logits: torch.Tensor) -> torch.Tensor:
        """Every rank returns the whole logits (host sampling, prefill)."""
        return self.cc.all_gather_last(logits)[:, : self.args.vocab_size] if self.cc.degree > 1 else logits


def sample_rows(
    spec: GraphSpec,
    logits: torch.Tensor,
    sampling: SamplingInputs,
    max_topk: int,
    cc: Collectives = SINGLE,
    vocab_offset: torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """On-device sampling of the decode rows' logits [n, V_local] -> token ids, or the (ids, logprobs, ranks) tensors
    (spec.logprobs). vocab_size: the model's (tensor parallelism: the logits are a padded slice)."""
    bias = sampling.logit_bias  # applied to the sampler's candidates, after the mask
    if sampling.bitmask is not None:  # the logprobs see it too: a masked token's stays near the (finite) fill
        logits = mask_disallowed(logits, sampling.bitmask, vocab_offset)
    params, uniform = sampling.params, sampling.uniform
    if spec.logprobs:
        return sample_with_logprobs(
            logits, params, uniform, max_topk, spec.logprobs, cc, vocab_offset, vocab_size, bias
        )
    return sample(logits, params, uniform, max_topk, cc, vocab_offset, vocab_size, bias=bias)


def inputs_class(spec: GraphSpec) -> type[GraphInputs]:
    """The inputs dataclass of the graph's kind (graph_inputs.py)."""
    if spec.name == COPY_PREFIX:
        return CopyInputs
    if spec.name == CHUNK_AND_DECODE:
        return ChunkAndDecodeInputs
    if spec.name == TOKEN_GENERATION:
        return DecodeInputs
    return RowsInputs


def example_inputs(spec: GraphSpec) -> tuple[torch.Tensor, ...]:
    """The graph's per-call inputs with example values and the graph's shapes, flattened (what tracing passes)."""
    return flat(inputs_class(spec).example(spec))
