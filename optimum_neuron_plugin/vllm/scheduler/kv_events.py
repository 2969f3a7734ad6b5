"""KV-cache events: what the prefix cache can serve as hits, in vLLM's event types, for prefix-aware routers.

With `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}'` vLLM's
scheduler creates its publisher (`EventPublisherFactory`, on the endpoint's port plus the engine's data-parallel
rank). The plugin's scheduler hands it, after every step, the blocks the prefix cache (prefix_cache.py) gained and
lost: `BlockStored` for each full block a slot holds as a hit (vLLM's chained hash of the request, its parent's hash,
its tokens, vLLM's block size), `BlockRemoved` when a slot's rows are reused or rewritten past it, `AllBlocksCleared`
on reset_prefix_cache.

Block size rule: the events use vLLM's block size (`--block-size`), the granularity of the hashes a router computes
for a prompt. A block is announced only while a hit may use it: a free slot's blocks, and with copy_prefix graphs an
owned slot's committed blocks (without them, a running request's blocks are announced when it finishes). Hits are
token-exact, so a request sharing n announced blocks with a replica hits at least n x block_size tokens there (one
less when the prompt ends exactly at the block's end: the last token is always prefilled) and at most block_size - 1
more inside the next block, which no event announces. The plugin's KV cache is not paged, so a smaller --block-size
costs no memory: it only makes the events finer (more events, a tighter bound).
"""

from __future__ import annotations

import time

from vllm.distributed.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisher,
    KVCacheEvent,
    KVEventBatch,
)
from vllm.v1.core.kv_cache_utils import (
    maybe_convert_block_hash,
    to_event_extra_keys,
)
from vllm.v1.request import Request

from ..compat import request_hasher, set_request_hasher
from .prefix_cache import Changes, Prefix


def hash_blocks(request: Request, hasher) -> None:
    """Give the request vLLM's block hashes: computed now and extended by vLLM as it appends tokens."""
    if request_hasher(request) is None:
        set_request_hasher(request, hasher)
        request.update_block_hashes()


def prefix_of(request: Request) -> Prefix:
    """The request's live token list and block hashes."""
    return Prefix(request.all_token_ids, request.block_hashes, request.cache_salt)


def vllm_events(changes: Changes, block_size: int) -> list[KVCacheEvent]:
    events: list[KVCacheEvent] = [AllBlocksCleared()] if changes.cleared else []
    if changes.removed:
        events.append(BlockRemoved([maybe_convert_block_hash(h) for h in changes.removed], medium=MEDIUM_GPU))
    for block in changes.stored:
        parent = None if block.parent is None else maybe_convert_block_hash(block.parent)
        events.append(
            BlockStored(
                block_hashes=[maybe_convert_block_hash(block.hash)],
                parent_block_hash=parent,
                token_ids=block.token_ids,
                block_size=block_size,
                lora_id=None,
                medium=MEDIUM_GPU,
                lora_name=None,
                extra_keys=to_event_extra_keys([(("cache_salt", block.salt),)]) if block.salt else None,
            )
        )
    return events


def publish(publisher: EventPublisher, changes: Changes, block_size: int) -> None:
    events = vllm_events(changes, block_size)
    if events:
        publisher.publish(KVEventBatch(ts=time.time(), events=events))
