"""A dummy step: one real decode graph call that changes no request's K/V (an idle data-parallel engine's step).

vLLM runs the data-parallel engines of a mixture-of-experts model in lock step: an engine with nothing to schedule
while another works runs a dummy batch, so that collectives between engines (expert parallelism) meet their peers.
The artifact's graphs have no collective between engines today, but the step is a real token_generation call all the
same: the same graph, the same collectives inside the engine's tensor-parallel ranks, the same device time an
engine's peers would wait for.

It writes one position: the last one (sequence_length - 1) of the last slot. No request's K/V is ever there: a request
holds at most max_model_len <= sequence_length tokens and its last token's K/V is never computed (it is sampled, not
fed back), so positions up to sequence_length - 2 are all a slot's requests or a prefix-cache hit can hold.
"""

from __future__ import annotations

from .model import NeuronModelForCausalLM


def dummy_step(model: NeuronModelForCausalLM) -> None:
    """One token_generation call writing only the last position of the last slot."""
    nc = model.neuron_config
    model.decode(seq_ids=[nc.batch_size - 1], token_ids=[0], positions=[nc.sequence_length - 1])
