"""The KV cache as vLLM's KV cache manager sees it: the artifact's pool of blocks.

One FullAttentionSpec per decoder layer, all alike, so vLLM makes one KV cache group: one block table per request
that every layer shares, as the graphs take it (a row's table, runtime/block_tables.py). A layer with a sliding
window is a full-attention layer to vLLM too: the graphs mask what lies outside its window.

The pool's size: vLLM divides the memory the worker reports (determine_available_memory) by a block's bytes over
the layers. The worker reports the artifact's compiled pool (NeuronConfig.num_blocks, the null block included),
or --kv-cache-memory-bytes when it is set; --num-gpu-blocks-override replaces the count. Either may ask for less
than the compiled pool, never more (the graphs index blocks up to num_blocks - 1).
"""

from __future__ import annotations

from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec

from ...artifact import cache_dtype
from ...runtime import NeuronModelForCausalLM

# The graphs' layout, vLLM's NHD (LBNHC): per layer a K and a V pool [num_blocks, block_size, kv_heads, head_dim]
# (models/kv_cache.py). vLLM allocates nothing for it: the runtime owns the pool.
SUPPORTED_LAYOUTS = ["LBNHC"]


def layer_names(num_layers: int) -> list[str]:
    return [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]


def kv_cache_spec(model: NeuronModelForCausalLM) -> dict[str, KVCacheSpec]:
    """This rank's layers (its shard of the KV heads under tensor parallelism), in the artifact's block size."""
    spec = FullAttentionSpec(
        block_size=model.neuron_config.block_size,
        num_kv_heads=model.shard_layout.kv_heads,
        head_size=model.args.head_dim,
        dtype=cache_dtype(model.neuron_config),
    )
    return {name: spec for name in layer_names(model.args.num_hidden_layers)}


def bytes_for_blocks(specs: dict[str, KVCacheSpec], num_blocks: int) -> int:
    """What num_blocks blocks of every layer occupy: the unit vLLM divides memory by."""
    return num_blocks * sum(spec.page_size_bytes for spec in specs.values())
