import sys; sys.path.insert(0, "/tmp/pp")
import logging; logging.disable(logging.WARNING)
import sim
from collections import Counter
from vllm.v1.core.sched.scheduler import Scheduler
from optimum_neuron_plugin.vllm.contract import prompt_tokens_left
events = []
orig = Scheduler._preempt_request
def spy(self, request, *a, **k):
    running = self.running
    prefilling = [r for r in running if prompt_tokens_left(r) > 0]
    # held blocks by prefilling vs decoding
    def nblocks(r):
        return len(self.kv_cache_manager.get_block_ids(r.request_id)[0])
    events.append(dict(victim=request.request_id, victim_left=prompt_tokens_left(request), victim_computed=request.num_computed_tokens,
        victim_blocks=nblocks(request),
        n_running=len(running), n_prefilling=len(prefilling), prefill_blocks=sum(nblocks(r) for r in prefilling),
        prefill_left=sum(prompt_tokens_left(r) for r in prefilling),
        decode_blocks=sum(nblocks(r) for r in running if prompt_tokens_left(r) == 0), prev=request.num_preemptions))
    return orig(self, request, *a, **k)
Scheduler._preempt_request = spy
for kind in sys.argv[1:]:
    events.clear()
    sim.run(kind)
    for e in events: print(e)
