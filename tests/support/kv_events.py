"""Reading vLLM's KV-cache events as a router does: a ZMQ subscriber decoding vLLM's own KVEventBatch, and the block
hashes vLLM computes for a token list (kv_cache_utils), to compare with what a server announced."""

from __future__ import annotations

import time

import msgspec
import zmq

BLOCK = 16  # the servers' --block-size


class Subscriber:
    """A ZMQ SUB socket on the server's event endpoint, decoding vLLM's KVEventBatch."""

    def __init__(self, port: int) -> None:
        from vllm.distributed.kv_events import KVEventBatch

        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.received = []

    def until(self, condition, timeout: float = 60) -> list:
        """Every event received until `condition(events so far)` holds."""
        deadline = time.monotonic() + timeout
        while not condition(self.received):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no such events after {timeout} s: {self.received}"
            if self.socket.poll(int(remaining * 1000)):
                _topic, _seq, payload = self.socket.recv_multipart()
                self.received += self.decoder.decode(payload).events
        return self.received

    def settled(self, quiet: float = 1.0) -> list:
        """Every event received until none has arrived for `quiet` seconds (a server publishes a step's events as the
        step ends: once its responses are out and it is idle, nothing more is coming)."""
        while self.socket.poll(int(quiet * 1000)):
            _topic, _seq, payload = self.socket.recv_multipart()
            self.received += self.decoder.decode(payload).events
        return self.received


def vllm_block_hashes(tokens: list[int]) -> list[int | bytes]:
    """vLLM's chained sha256 block hashes of tokens' full blocks (kv_cache_utils, as vLLM's engine computes them), as
    its events carry them (maybe_convert_block_hash: 64-bit integers unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash, maybe_convert_block_hash

    init_none_hash(sha256)
    hashes, parent = [], None
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        parent = hash_block_tokens(sha256, parent, tokens[start : start + BLOCK])
        hashes.append(parent)
    return [maybe_convert_block_hash(h) for h in hashes]


def stored(events) -> dict[bytes, object]:
    from vllm.distributed.kv_events import BlockStored

    return {h: e for e in events if isinstance(e, BlockStored) for h in e.block_hashes}


def removed(events) -> set[bytes]:
    from vllm.distributed.kv_events import BlockRemoved

    return {h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes}
