"""vLLM's data parallelism with compiled artifacts: which modes serve, where each engine runs, what is refused.

vLLM 0.32 runs data_parallel_size engine processes, each with its own workers, artifact instance, KV pool and
vLLM block manager; the plugin needs nothing from the other engines. Every mode of vLLM's multiprocess ("mp") DP backend
serves, because each is only a different way of starting and addressing those engines:

- one node: `--data-parallel-size N`; vLLM's front end balances requests (its DP coordinator collects queue stats);
- several nodes, one API (internal load balancing): the head `--data-parallel-size N --data-parallel-size-local n
  --data-parallel-address A --data-parallel-rpc-port P`, every other node the same plus `--headless
  --data-parallel-start-rank r`; `--data-parallel-size-local 0` makes the head an API server only;
- hybrid load balancing (`--data-parallel-hybrid-lb`, or a start rank without --headless): one API per node in
  front of that node's engines, an external router between nodes;
- external load balancing (`--data-parallel-rank k`, or `--data-parallel-external-lb`): one API per engine. vLLM
  allows it for MoE models only (a dense model's engines share nothing: it says to run independent servers), and
  switches hybrid load balancing with one engine per node to it.

Dense models: vLLM runs each engine as an independent EngineCoreProc (`reconfigure_for_independent_dp_rank`: no DP
all-reduce, no dummy batches). MoE models: vLLM runs the engines in lock step (DPEngineCoreProc: an all-reduce of
"unfinished requests" and a dummy batch on an idle engine); the worker's dummy step is a real decode graph call that
writes no request's K/V (worker.execute_dummy_batch, runtime/dummy_step.py).

Placement is per node: the engines started on one node are its local DP ranks 0..n-1 (vLLM's
data_parallel_rank_local), each of tp_size workers; placement.py gives local rank l, worker t the
(l * tp_size + t)-th NeuronCore of the node's NEURON_RT_VISIBLE_CORES (each engine a contiguous range), or its
share of the node's CPU threads. The node-local engine count is recorded in additional_config for the workers.
"""

from __future__ import annotations

import os

from vllm.config import ParallelConfig

from ...backends.neuron import neuron_core_count
from ...placement import Rank, neuron_core
from .options import serves_on_neuron


def local_engines(parallel: ParallelConfig) -> int:
    """The engines this node starts (at least 1: an API-only head still fits one), kept for placement."""
    return max(parallel.data_parallel_size_local, 1)


def data_parallel_problems(parallel: ParallelConfig) -> list[str]:
    """What cannot serve (empty when all can)."""
    problems = []
    if parallel.enable_expert_parallel:
        problems.append(
            "expert parallelism is not supported: remove --enable-expert-parallel (the artifact's graphs hold every "
            "expert on each tensor-parallel rank and have no all-to-all between engines; data parallel engines "
            "each serve the whole model)"
        )
    if parallel.data_parallel_size == 1:
        return problems
    if parallel.data_parallel_backend != "mp":
        problems.append(
            f"data_parallel_backend={parallel.data_parallel_backend!r} is not supported: remove "
            "--data-parallel-backend (vLLM's Ray backend places each engine as a Ray actor on the platform's Ray "
            "device resource and sets its devices through Ray; the Neuron plugin declares no Ray device and places "
            "engines on NeuronCores itself, so use the mp backend: --headless nodes for several machines)"
        )
    last = last_local_rank(parallel)
    if last is not None:
        problems += core_problems(last)
    return problems


def last_local_rank(parallel: ParallelConfig) -> Rank | None:
    """The last worker this node starts (its cores must exist), or None: no engine here, or not on Neuron."""
    local, tp = parallel.data_parallel_size_local, parallel.tensor_parallel_size
    if parallel.data_parallel_size == 1 or local < 1 or not serves_on_neuron():
        return None
    return Rank(dp_rank=local - 1, dp_size=local, tp_rank=tp - 1, tp_size=tp)


def core_problems(last: Rank) -> list[str]:
    """The node's last rank must find its own NeuronCore (placement.neuron_core)."""
    visible = os.environ.get("NEURON_RT_VISIBLE_CORES")
    try:
        neuron_core(last, visible)
    except ValueError as error:
        return [str(error)]
    if not visible and (cores := neuron_core_count()) < last.count:
        return [
            f"{last.count} rank(s) (data parallel {last.dp_size} x tensor parallel {last.tp_size}) on this node need "
            f"{last.count} NeuronCores but it shows {cores}: lower --data-parallel-size-local (or "
            "--data-parallel-size)"
        ]
    return []
