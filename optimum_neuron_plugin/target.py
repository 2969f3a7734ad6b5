"""The instance type a neuron export compiles for: --instance-type (NeuronConfig.target), else this host's.

It sets the FP8 weights' range (trn2's E4M3 holds +-240, trn3's +-448: models/fp8.py), whether neuronx-cc needs trn2's
FP8 option (runtime/artifact_io.py) and the HBM the memory plan counts (sizing.py). Imports no torch: the CLI resolves
it while it checks the options.
"""

from __future__ import annotations

from dataclasses import replace

from .config import NeuronConfig
from .devices import HostQueryError, host_instance_type
from .errors import ExportError

NOT_NEURON = "this host is not a Neuron instance (no /dev/neuron* device or no torch-neuronx)"


def resolve_target(neuron_config: NeuronConfig) -> NeuronConfig:
    """A neuron config without a target takes this host's instance type. FP8 graphs are refused when neither the
    config nor the host says which instance type it is; other graphs keep no target (the memory plan then assumes
    trn2, the smaller chip, and says so)."""
    nc = neuron_config
    if nc.backend != "neuron" or nc.target is not None:
        return nc
    try:
        host, why = host_instance_type(), NOT_NEURON
    except HostQueryError as error:
        host, why = None, str(error)
    if host is not None:
        return replace(nc, target=host)
    if nc.quantization or nc.kv_cache_dtype:
        raise ExportError(
            "FP8 graphs (--quantize fp8, --kv-cache-dtype fp8 or an FP8 checkpoint) on the neuron backend depend on "
            f"the instance type (trn2's FP8 holds +-240, trn3's +-448, and trn2 needs a compiler option), and {why}: "
            "pass --instance-type trn2|trn3 (NeuronConfig target=)"
        )
    return nc
