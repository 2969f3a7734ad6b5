"""vLLM platform plugin: `vllm serve <exported dir>` runs the compiled graphs of an artifact.

Registered under the entry-point group `vllm.platform_plugins`; vLLM calls `register()` in every
process it starts. It must stay cheap and must not import vLLM or torch (compat.py's version check reads package metadata only).
"""

from __future__ import annotations

from .compat import check_vllm_version
from .engine.options import plugin_enabled

PLATFORM = "optimum_neuron_plugin.vllm.platform.NeuronPlatform"


def register() -> str | None:
    """The platform's class path when Neuron devices exist or ONP_BACKEND asks for the plugin, else None."""
    if not plugin_enabled():
        return None
    check_vllm_version()  # a vLLM the compat entries were not written for stops here, naming both versions
    return PLATFORM


__all__ = ["PLATFORM", "register"]
