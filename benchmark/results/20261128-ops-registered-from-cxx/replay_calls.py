"""A replayed trace of 180 onp::rms_norm calls (a SmolLM2 decode step's count of onp ops), quiet and with a busy
Python thread beside it: the cost of the op's CPU kernel registration, run against a checkout.

    PYTHONPATH=CHECKOUT .venv/bin/python benchmark/results/20261128-ops-registered-from-cxx/replay_calls.py LABEL
"""

from __future__ import annotations

import json
import sys
import threading
import time

import torch

from optimum_neuron_plugin.backends import cpu_pointwise  # noqa: F401 - the ops' CPU kernels

torch.set_num_threads(1)
x, weight = torch.randn(4, 576), torch.randn(576)


class Norms(torch.nn.Module):
    def forward(self, x, weight):
        for _ in range(180):
            x = torch.ops.onp.rms_norm.default(x, weight, 1e-5, 0.0)
        return x


with torch.inference_mode():
    trace = torch.jit.trace(Norms(), (x, weight), check_trace=False)


def replay_ms(calls: int = 200) -> float:
    with torch.inference_mode():
        for _ in range(10):
            trace(x, weight)
        began = time.perf_counter()
        for _ in range(calls):
            trace(x, weight)
        return (time.perf_counter() - began) / calls * 1e3


def busy(stop: threading.Event) -> None:
    payload = {"a": list(range(50))}
    while not stop.is_set():
        json.dumps(payload)


quiet = replay_ms()
stop = threading.Event()
thread = threading.Thread(target=busy, args=(stop,))
thread.start()
loaded = replay_ms()
stop.set()
thread.join()
print(f"{sys.argv[1]}: {quiet:.2f} ms per 180 calls, {loaded:.2f} ms with a busy Python thread")
