"""vLLM platform plugin: `vllm serve <exported dir>` runs the compiled graphs of an artifact.

Registered under the entry-point group `vllm.platform_plugins`; vLLM calls `register()` in every
process it starts. It must stay cheap and must not import vLLM or torch.
"""

from __future__ import annotations

from .engine.options import plugin_enabled

PLATFORM = "optimum_neuron_plugin.vllm.platform.NeuronPlatform"


def register() -> str | None:
    """The platform's class path when Neuron devices exist or ONP_BACKEND asks for the plugin, else None."""
    return PLATFORM if plugin_enabled() else None


__all__ = ["PLATFORM", "register"]
