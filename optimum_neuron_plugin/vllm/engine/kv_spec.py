"""The KV cache as vLLM's scheduler sees it.

Decision: one FullAttentionSpec per decoder layer, with the block count pinned (in
engine_config.kv_blocks_needed, through num_gpu_blocks_override) to max_num_seqs full-length
requests plus the null block. The alternative, an empty spec, makes vLLM treat the model as
attention-free: chunked prefill is switched off (so a prompt longer than max_num_batched_tokens
waits forever) and scheduler-driven chunking (prefill_mode=interleaved) is impossible.

With enough blocks for every admitted request at max_model_len, admission is bounded by
max_num_seqs (<= batch_size) alone and the scheduler never preempts a running request for
lack of blocks. The blocks are bookkeeping only: nothing is allocated for them; the runtime
owns the real cache ([batch_size, sequence_length] per layer) and a request's cache row is its slot.
"""

from __future__ import annotations

from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec

from ...artifact import cache_dtype
from ...runtime import NeuronModelForCausalLM

# Any layout: vLLM allocates nothing for us. NHD order, the usual default.
SUPPORTED_LAYOUTS = ["LBNHC"]


def layer_names(num_layers: int) -> list[str]:
    return [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]


def kv_cache_spec(model: NeuronModelForCausalLM, block_size: int) -> dict[str, KVCacheSpec]:
    args = model.args
    spec = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=args.num_key_value_heads,
        head_size=args.head_dim,
        dtype=cache_dtype(model.neuron_config),
    )
    return {name: spec for name in layer_names(args.num_hidden_layers)}


def bytes_for_blocks(specs: dict[str, KVCacheSpec], num_blocks: int) -> int:
    """What vLLM's block pool would occupy: reported as 'available memory', never allocated."""
    return num_blocks * sum(spec.page_size_bytes for spec in specs.values())
