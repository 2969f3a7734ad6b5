
def patch():
    from vllm.v1.request import RequestStatus
    import optimum_neuron_plugin.vllm.scheduler.scheduler as mod
    def old_admittable(self, running):
        limit = min(self.max_num_running_reqs, self.max_num_active_reqs)
        free = limit - len(self.running) - self.num_waiting_for_streaming_input
        ready = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        queued = [*self.kv_holding_waiting, *self.waiting]
        return [r for r in queued if r.status in ready][: max(free, 0)]
    mod.NeuronScheduler._admittable_waiting = old_admittable
