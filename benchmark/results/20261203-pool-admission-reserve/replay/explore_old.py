import os, sys, math, random
os.environ["ONP_BACKEND"] = "cpu"; os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path[:0] = ["/work/wt-pool-preemption/tests", "/work/wt-pool-preemption/tests/vllm"]
import logging; logging.disable(logging.WARNING)
from pathlib import Path
from support.served import CHUNK, SEQUENCE_LENGTH
import test_interleave_policy as t
import optimum_neuron_plugin.vllm.scheduler.scheduler as mod
from vllm.v1.request import RequestStatus
def old_admittable(self, running):
    limit = min(self.max_num_running_reqs, self.max_num_active_reqs)
    free = limit - len(self.running) - self.num_waiting_for_streaming_input
    ready = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
    queued = [*self.kv_holding_waiting, *self.waiting]
    return [r for r in queued if r.status in ready][: max(free, 0)]
mode = sys.argv[1]
if mode == "old":
    mod.NeuronScheduler._admittable_waiting = old_admittable
def replay(s, lengths, clients, cap=3000):
    queue, live, pre, steps = list(lengths), [], 0, 0
    while (queue or live) and steps < cap:
        while queue and len(live) < clients:
            p, o = queue.pop(0); live.append(t.add(s, f"r{len(queue)}", p, max_tokens=o))
        t.step(s); steps += 1
        pre += sum(r.num_preemptions for r in live if r.is_finished())
        live = [r for r in live if not r.is_finished()]
    if steps >= cap:
        from optimum_neuron_plugin.vllm.contract import prompt_tokens_left
        from optimum_neuron_plugin.vllm.compat import free_blocks
        out = s.schedule()
        print("STALLED: scheduled", dict(out.num_scheduled_tokens), "plan", s._slices, "free blocks", free_blocks(s),
              "running", [(r.request_id, r.num_computed_tokens, prompt_tokens_left(r)) for r in s.running],
              "waiting", [(r.request_id, r.num_tokens) for r in s.waiting])
    return pre + sum(r.num_preemptions for r in live), steps
pool = Path(sys.argv[2]); rows = int(sys.argv[3])
for pm, om, n in [(40, 16, 48)]:
    rng = random.Random(0); lengths = []
    for _ in range(n):
        prompt = max(4, min(SEQUENCE_LENGTH - 40, round(rng.lognormvariate(math.log(pm), 1.0))))
        lengths.append((prompt, max(2, min(32, round(rng.lognormvariate(math.log(om), 1.0))))))
    print(mode, rows, pm, om, n, "plugin", replay(t.make_scheduler(pool), lengths, rows), "vllm", replay(t.make_scheduler(pool, vllm_own_tokens=2048), lengths, rows), flush=True)
