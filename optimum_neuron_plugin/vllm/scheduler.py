"""NeuronScheduler: vLLM's scheduler, plus failing the requests whose graph call raised.

Decision: a compiled graph call that raises (a Neuron runtime error, an artifact whose graph cannot
run some input, ...) fails the requests of that call, not the engine. The runner catches the
exception, logs it with the graph's file, and reports the requests in
NeuronRunnerOutput.failed_req_ids; this scheduler finishes them with FINISHED_ERROR, which vLLM's
OpenAI server answers with a 500 ("Internal server error"), and frees their cache slots. Every
other request keeps running and later requests are served. Without this, vLLM 0.32 treats any
worker exception as a dead engine: every in-flight request fails and `vllm serve` exits with status 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import RequestStatus


@dataclass
class NeuronRunnerOutput(ModelRunnerOutput):
    """vLLM's step output plus the requests whose graph call raised (they sampled nothing)."""

    failed_req_ids: list[str] = field(default_factory=list)


class NeuronScheduler(Scheduler):
    def update_from_output(self, scheduler_output, model_runner_output: ModelRunnerOutput):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        failed = getattr(model_runner_output, "failed_req_ids", None)
        if failed:
            for request in self.finish_requests(failed, RequestStatus.FINISHED_ERROR):
                error = EngineCoreOutput(
                    request_id=request.request_id, new_token_ids=[], finish_reason=request.get_finished_reason()
                )
                client = outputs.setdefault(request.client_index, EngineCoreOutputs(outputs=[]))
                client.outputs.append(error)
        return outputs
