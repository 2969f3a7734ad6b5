"""The host-memory KV tier under vLLM's OffloadingConnector: the copies between the pool and host memory.

vLLM's OffloadingConnector decides everything on its scheduler side, unchanged: which full blocks to store in host
memory (its CPU manager, LRU by default, sized by cpu_bytes_to_use), which of a new request's blocks it can load back
when the pool no longer holds them, and the hit counts it reports. Its own copy worker moves pages with CUDA streams
over vLLM's one-tensor-per-layer page layout; HostCopies does the same moves for the plugin's pool (per layer K and
V in one [2, num_blocks, block_size, kv_heads, head_dim] tensor, models/kv_cache.py), as whole-block index copies,
finished when submitted: a store copies blocks the previous step wrote, a load runs before the step's graphs.
On the CPU backend both tiers are host memory; on Neuron a copy is a device-host DMA (docs/deployment.md).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from vllm.v1.kv_offload.base import GPULoadStoreSpec, LoadStoreSpec, OffloadingWorker, TransferResult


class HostCopies(OffloadingWorker):
    def __init__(self, pools: list[torch.Tensor], num_chunks: int, blocks_per_chunk: int) -> None:
        if blocks_per_chunk != 1:
            raise ValueError(
                f"the host KV tier stores one pool block per host chunk, not {blocks_per_chunk}: remove block_size "
                "from kv_connector_extra_config (or set it to the artifact's block size)"
            )
        self.pools = pools
        self.host = [torch.zeros((2, num_chunks, *pool.shape[2:]), dtype=pool.dtype) for pool in pools]
        self.finished: list[TransferResult] = []

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._copy(job_id, src_spec.block_ids, dst_spec.block_ids, to_host=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._copy(job_id, dst_spec.block_ids, src_spec.block_ids, to_host=False)

    def _copy(self, job_id: int, blocks: np.ndarray, chunks: np.ndarray, to_host: bool) -> bool:
        began = time.perf_counter()
        blocks, chunks = torch.from_numpy(blocks).long(), torch.from_numpy(chunks).long()
        moved = 0
        for pool, host in zip(self.pools, self.host, strict=True):
            if to_host:
                host.index_copy_(1, chunks, pool.index_select(1, blocks))
            else:
                pool.index_copy_(1, blocks, host.index_select(1, chunks))
            moved += pool[:, 0].nbytes * len(blocks)
        self.finished.append(TransferResult(job_id, True, moved, time.perf_counter() - began))
        return True

    def get_finished(self) -> list[TransferResult]:
        finished, self.finished = self.finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return None  # every copy finished when it was submitted
