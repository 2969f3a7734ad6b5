"""vLLM's KV connector (--kv-transfer-config) around a step's graph calls.

vLLM's scheduler side of a connector runs unchanged in the engine (which tokens it loads, which blocks it saves, when
a request's transfer is done); this is the worker side. The graphs run the whole model in one call, so vLLM's
per-layer hooks collapse: before the step's graphs, start_load_kv and a wait for every layer (a block the step reads
is loaded before any graph runs); after them, save_kv_layer for every layer, then wait_for_save and the finished
sends and receives, returned in the step's ModelRunnerOutput (kv_connector_output).

What a connector sees of the pool: per layer one tensor [num_blocks, 2, block_size, kv_heads, head_dim] (K then V
of each block), a view of the runtime's pool (models/kv_cache.py empty_pools: [2, num_blocks, ...] per layer), with
vLLM's block ids at dim 0 and the block's positions at dim 2, where connectors that address slots index them.
OffloadingConnector (the host-memory tier) copies whole blocks through host_tier.py instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput

from ...runtime import NeuronModelForCausalLM
from ..compat import connector_forward_context, offloading_chunks, use_offloading_worker
from ..engine.kv_spec import layer_names
from .host_tier import HostCopies

HOST_TIER_CONNECTOR = "OffloadingConnector"  # its copies are the plugin's (host_tier.py)


class KVTransfer:
    def __init__(self, connector: KVConnectorBase_V1, layers: dict[str, torch.Tensor]) -> None:
        self.connector = connector
        self.layers = layers  # layer name -> [num_blocks, 2, block_size, kv_heads, head_dim] view of the pool

    @classmethod
    def create(
        cls, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, model: NeuronModelForCausalLM
    ) -> KVTransfer | None:
        """The worker's connector with the pool registered; None without --kv-transfer-config."""
        config = vllm_config.kv_transfer_config
        if config is None or not config.is_kv_transfer_instance:
            return None
        connector = KVConnectorFactory.create_connector(
            config=vllm_config, role=KVConnectorRole.WORKER, kv_cache_config=kv_cache_config
        )
        names = layer_names(model.args.num_hidden_layers)
        layers = {name: pool.transpose(0, 1) for name, pool in zip(names, model.kv_pools, strict=True)}
        if config.kv_connector == HOST_TIER_CONNECTOR:
            use_offloading_worker(connector, HostCopies(model.kv_pools, *offloading_chunks(connector)))
        else:
            connector.register_kv_caches(layers)
        return cls(connector, layers)

    @contextmanager
    def around_graphs(self, scheduler_output: SchedulerOutput) -> Iterator[KVConnectorOutput]:
        """Loads before the body (the step's graph calls), saves after it; the output is filled on exit."""
        connector, output = self.connector, KVConnectorOutput()
        metadata = scheduler_output.kv_connector_metadata
        if metadata is None:
            raise RuntimeError("vLLM's scheduler sent no KV connector metadata for the step of a KV transfer instance")
        connector.handle_preemptions(metadata)
        connector.bind_connector_metadata(metadata)
        try:
            connector.start_load_kv(connector_forward_context(self.layers))
            for name in self.layers:
                connector.wait_for_layer_load(name)
            output.invalid_block_ids = connector.get_block_ids_with_load_errors()  # their requests run no graph
            yield output
            for name, cache in self.layers.items():
                connector.save_kv_layer(name, cache, None)
            connector.wait_for_save()
            results = connector.get_transfer_results(scheduler_output.finished_req_ids)
            output.finished_sending = results.finished_sending
            output.finished_recving = results.finished_recving
            output.failed_recving = results.failed_recving
            output.invalid_block_ids |= connector.get_block_ids_with_load_errors()
            output.kv_connector_stats = connector.get_kv_connector_stats()
            output.kv_cache_events = connector.get_kv_connector_kv_cache_events()
            output.kv_connector_worker_meta = connector.build_connector_worker_meta()
        finally:
            connector.clear_connector_metadata()

    def without_graphs(self, scheduler_output: SchedulerOutput) -> KVConnectorOutput:
        """A step that schedules no tokens still moves KV and reports finished transfers."""
        with self.around_graphs(scheduler_output) as output:
            pass
        return output

    def handshake_metadata(self):
        return self.connector.get_handshake_metadata()

    def shutdown(self) -> None:
        self.connector.shutdown()
