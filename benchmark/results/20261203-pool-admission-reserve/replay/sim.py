"""Scheduler-level replay of the mixed-chat workload: NeuronScheduler (interleaved) vs vLLM's Scheduler (CPU peer's
config), same pool, closed-loop clients, counting preemptions and recomputed prompt tokens."""
import argparse, math, sys, random, os
os.environ["ONP_BACKEND"] = "cpu"
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, "/work/wt-pool-preemption/tests")
sys.path.insert(0, "/work/wt-pool-preemption/benchmark/workloads")
from itertools import count
from support.engine import block_hasher

ART = "/tmp/pp/pool-32"

def make(kind, model=ART, tokens=2048, seqs=32):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from optimum_neuron_plugin.artifact import load_neuron_config
    from optimum_neuron_plugin.vllm.engine.kv_spec import layer_names
    args = EngineArgs(model=model, additional_config={"prefill_mode": "interleaved"}, enable_prefix_caching=False)
    config = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    cache = config.cache_config
    cache.num_gpu_blocks = load_neuron_config(model).num_blocks
    spec = FullAttentionSpec(block_size=cache.block_size, num_kv_heads=2, head_size=16, dtype=config.model_config.dtype)
    kvc = KVCacheConfig(num_blocks=cache.num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(layer_names(2), spec)])
    if kind == "vllm":
        config.scheduler_config.max_num_batched_tokens = tokens
        config.scheduler_config.max_num_seqs = seqs
        cls = Scheduler
    else:
        cls = config.scheduler_config.get_scheduler_cls()
    return cls(vllm_config=config, kv_cache_config=kvc, structured_output_manager=StructuredOutputManager(config), block_size=cache.block_size)

def latencies(model, decode, chunk):
    from optimum_neuron_plugin.artifact import load_neuron_config
    from optimum_neuron_plugin.graphs import TOKEN_GENERATION, graph_specs
    from optimum_neuron_plugin.runtime.graph_select import spec_key
    from optimum_neuron_plugin.runtime.latency import GraphLatencies
    from optimum_neuron_plugin.vllm.scheduler.step_budget import measured_kind
    nc = load_neuron_config(model)
    specs = [s for s in graph_specs(nc, vocab_size=256) if measured_kind(nc, s.name, s.rows)]
    return GraphLatencies({spec_key(s): (decode if s.name == TOKEN_GENERATION else chunk) for s in specs})

def workload(n=64, seed=0, max_model_len=2048):
    import mixed_chat
    ns = argparse.Namespace(requests=n, prompt_median=300, prompt_min=64, prompt_max=3000, output_median=96,
                            output_min=32, output_max=512, sigma=1.0, vocab=49152, seed=seed)
    return mixed_chat.requests(ns, max_model_len)

def run(kind, clients=32, n=64, verbose=False, **kw):
    from vllm import SamplingParams
    from vllm.v1.request import Request
    from optimum_neuron_plugin.vllm.contract import NeuronRunnerOutput
    s = make(kind, **kw)
    queue = list(workload(n))
    arrivals = count()
    live = {}
    done = []
    def submit():
        prompt, out = queue.pop(0)
        rid = f"r{len(done) + len(live)}"
        req = Request(rid, prompt, SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True), None,
                      arrival_time=float(next(arrivals)), block_hasher=block_hasher(s.block_size))
        s.add_request(req)
        live[rid] = req
    for _ in range(min(clients, len(queue))):
        submit()
    lat = latencies(ART, 0.092, 0.47)
    steps = prefill_tokens = chunk_calls = empty = 0
    first = True
    while live:
        out = s.schedule()
        sched = dict(out.num_scheduled_tokens)
        steps += 1
        empty += not sched
        ids = list(sched)
        sampled = []
        for rid in ids:
            r = s.requests[rid]
            n_new = sched[rid]
            if n_new > 1 or r.num_computed_tokens - n_new < r.num_tokens - 1:  # prefill slice (incl. recompute)
                prefill_tokens += n_new
                chunk_calls += math.ceil(n_new / 256)
            sampled.append([7] if r.num_computed_tokens >= r.num_tokens else [])
        ro = NeuronRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
                                graph_latencies=lat if first else None)
        first = False
        s.update_from_output(out, ro)
        if verbose and out.preempted_req_ids if hasattr(out, "preempted_req_ids") else False:
            print(steps, "preempted", out.preempted_req_ids, "free", s.kv_cache_manager.block_pool.get_num_free_blocks())
        for rid in list(live):
            if live[rid].is_finished():
                done.append(live.pop(rid))
                if queue:
                    submit()
    pre = sum(r.num_preemptions for r in done)
    print(f"{kind:8s} steps={steps} preemptions={pre} prefill_tokens={prefill_tokens} chunk_calls~={chunk_calls} "
          f"preempted_reqs={sum(1 for r in done if r.num_preemptions)} empty_steps={empty} max_preempt_one={max(r.num_preemptions for r in done)}")
    return s, done

if __name__ == "__main__":
    import logging; logging.disable(logging.WARNING)
    if "old" in sys.argv:
        sys.path.insert(0, "/tmp/pp"); from explore_old_patch import patch; patch()
    for kind in [a for a in sys.argv[1:] if a in ("neuron", "vllm")]:
        run(kind, verbose="-v" in sys.argv)
