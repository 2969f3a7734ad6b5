"""optimum-neuron-plugin: serve LLMs with vLLM on AWS Neuron, with chunked prefill done right."""

from .config import NeuronConfig
from .errors import ArtifactError, ExportError, InputError, NeuronConfigError
from .version import __version__


def __getattr__(name: str):
    # Lazy: importing the package (and the CLI's argument checks) stays cheap: no torch until needed.
    if name == "NeuronModelForCausalLM":
        from .runtime import NeuronModelForCausalLM

        return NeuronModelForCausalLM
    if name == "SamplingParams":
        from .sampling import SamplingParams

        return SamplingParams
    raise AttributeError(name)


__all__ = [
    "ArtifactError",
    "ExportError",
    "InputError",
    "NeuronConfig",
    "NeuronConfigError",
    "NeuronModelForCausalLM",
    "SamplingParams",
    "__version__",
]
