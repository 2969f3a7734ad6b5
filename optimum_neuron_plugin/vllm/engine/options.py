"""Plugin options, read from environment variables with this project's own `ONP_` prefix.

vLLM warns about (or, with `--fail-on-environ-validation`, rejects) unknown names that start
with `VLLM_`, so the plugin never uses that prefix.

- `ONP_BACKEND`: `cpu` activates the plugin on a host without Neuron devices, serving an artifact
  exported with the CPU reference backend; `neuron` activates it unconditionally; `off` never
  activates it. Unset (or `auto`): active only when Neuron devices (/dev/neuron<N>, devices.py) are present.
  Any other value is refused at startup with the valid ones.
- `ONP_PREFILL_MODE`: `interleaved` or `serial`, see `PrefillMode`. vLLM's
  `--additional-config '{"prefill_mode": "serial"}'` takes precedence over the variable. Unset: `default_prefill_mode`,
  interleaved unless the artifact has no prefill chunks, `--no-enable-chunked-prefill` is given or speculative
  decoding is on (it runs in the serial mode).
- `ONP_CPU_THREADS`: intra-op threads of the CPU backend's graphs, per engine rank (default: the
  server's threads, OMP_NUM_THREADS if set, else every core it may run on, split evenly between the
  data-parallel x tensor-parallel ranks, placement.py).
- `ONP_PREFILL_TARGET_ITL_MS`: interleaved mode only, the step time (inter-token latency of the running streams) the
  scheduler fits each step's prefill chunk calls into, from the graph latencies measured at warm-up (scheduler/step_budget.py).
  Default: a decode step plus one chunk call. additional_config key `prefill_target_itl_ms`.
- `ONP_PREFILL_CHUNK_BUDGET`: interleaved mode only, a fixed number of prefill graph calls (compiled chunks) per
  engine step instead of the latency target; additional_config key `prefill_chunk_budget`.
- `ONP_SPECULATION_MIN_ACCEPTANCE`: speculative decoding, the draft acceptance below which a request pauses
  drafting (draft_gate.py); 0 also verifies every draft whatever the verify call costs (verify_cost.py).
"""

from __future__ import annotations

import os
from enum import Enum

from vllm.utils.torch_utils import OMP_NUM_THREADS_SET_BY_VLLM

from ... import placement
from ...devices import neuron_devices_present
from ...placement import Rank

BACKEND_ENV = "ONP_BACKEND"
PREFILL_MODE_ENV = "ONP_PREFILL_MODE"
PREFILL_MODE_KEY = "prefill_mode"
CPU_THREADS_ENV = "ONP_CPU_THREADS"
PREFILL_CHUNK_BUDGET_ENV = "ONP_PREFILL_CHUNK_BUDGET"
PREFILL_CHUNK_BUDGET_KEY = "prefill_chunk_budget"
PREFILL_TARGET_ITL_ENV = "ONP_PREFILL_TARGET_ITL_MS"
PREFILL_TARGET_ITL_KEY = "prefill_target_itl_ms"
# Set by the plugin (engine_config): the server's --data-parallel-size, which vLLM resets to 1 in each engine.
DATA_PARALLEL_SIZE_KEY = "data_parallel_size"
BACKEND_VALUES = ("cpu", "neuron", "off", "auto")


class PrefillMode(str, Enum):
    """How prompts are prefilled.

    SERIAL: vLLM schedules each prompt whole; the runner prefills it in one step with its own
    chunk loop (one graph call per compiled chunk), after the step's batched decode.
    INTERLEAVED: the scheduler hands out prompt slices (whole compiled chunks, at most
    as many chunk calls per step as fit the latency target, shortest remaining prompt first: interleave.py);
    the runner prefills them in the same step as the decode of the running requests, so a long
    prompt does not stall them.
    """

    SERIAL = "serial"
    INTERLEAVED = "interleaved"


def backend_requested() -> str:
    """ONP_BACKEND as one of BACKEND_VALUES ("auto" when unset); raise ValueError for any other value."""
    value = os.environ.get(BACKEND_ENV, "").strip().lower() or "auto"
    if value not in BACKEND_VALUES:
        raise ValueError(
            f"{BACKEND_ENV}={os.environ[BACKEND_ENV]!r} is not a valid value: set it to one of "
            f"{', '.join(BACKEND_VALUES)} (auto, or unset: the plugin runs when Neuron devices are present)"
        )
    return value


def plugin_enabled() -> bool:
    """An invalid ONP_BACKEND enables the plugin, which refuses it at startup (vLLM swallows errors raised while it
    detects platforms, so refusing here would silently leave the host to another platform)."""
    try:
        requested = backend_requested()
    except ValueError:
        return True
    return requested in ("cpu", "neuron") or (requested == "auto" and neuron_devices_present())


def asked_prefill_mode(additional_config: object = None) -> PrefillMode | None:
    """The prefill mode set in additional_config (where engine_config also records the mode it decided), else by
    ONP_PREFILL_MODE; None when neither is."""
    value = _additional(additional_config, PREFILL_MODE_KEY, PREFILL_MODE_ENV)
    if value is None:
        return None
    try:
        return PrefillMode(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in PrefillMode)
        raise ValueError(
            f"prefill mode {value!r} is not allowed: set {PREFILL_MODE_ENV} (or additional_config "
            f"{PREFILL_MODE_KEY!r}) to one of {allowed}"
        ) from None


class SerialReason(Enum):
    """Why an engine whose prefill mode is not set runs serially (options.default_prefill_mode)."""

    NO_CHUNKS = "an export without prefill chunks: every slice would cost a full-length call"
    NO_CHUNKED_PREFILL = "--no-enable-chunked-prefill: the user turned vLLM's prompt chunking off"
    SPECULATIVE = "speculative decoding: it runs in the serial mode"


def serial_reason(chunked: bool, chunked_prefill: bool | None, speculative: bool) -> SerialReason | None:
    """What keeps an engine whose prefill mode is not set serial (chunked_prefill: --[no-]enable-chunked-prefill as
    given, None unset); None: nothing, it interleaves."""
    if not chunked:
        return SerialReason.NO_CHUNKS
    if chunked_prefill is False:
        return SerialReason.NO_CHUNKED_PREFILL
    if speculative:
        return SerialReason.SPECULATIVE
    return None


def default_prefill_mode(chunked: bool, chunked_prefill: bool | None, speculative: bool) -> PrefillMode:
    """The mode of an engine whose prefill mode is not set: interleaved (a long prompt does not stall the running
    streams, and a short prompt does not wait for a long one's whole prefill), serial where a SerialReason holds."""
    if serial_reason(chunked, chunked_prefill, speculative) is not None:
        return PrefillMode.SERIAL
    return PrefillMode.INTERLEAVED


def prefill_mode(additional_config: object = None) -> PrefillMode:
    """The mode the engine runs, recorded by engine_config.apply (which decides it from the asked mode or the
    default)."""
    mode = asked_prefill_mode(additional_config)
    if mode is None:
        raise RuntimeError(f"no prefill mode in additional_config: engine_config.apply records {PREFILL_MODE_KEY!r}")
    return mode


def cpu_threads(rank: Rank | None = None) -> int:
    """Intra-op threads of one rank (default: a server's only one): ONP_CPU_THREADS as given, else its share of
    the server's threads."""
    value = os.environ.get(CPU_THREADS_ENV, "").strip()
    if not value:
        # vLLM's multiprocess executor sets OMP_NUM_THREADS to its own per-worker share when unset: not the user's.
        omp = "" if os.environ.get(OMP_NUM_THREADS_SET_BY_VLLM) == "1" else os.environ.get("OMP_NUM_THREADS", "")
        total = int(omp) if omp.isdigit() and int(omp) > 0 else len(os.sched_getaffinity(0))
        return placement.cpu_threads(rank or Rank(), total)
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{CPU_THREADS_ENV}={value!r} is not allowed: set it to a number of threads >= 1, or unset it")
    return int(value)


def data_parallel_size(additional_config: object = None) -> int:
    """The number of engines the server runs (engine_config records it in additional_config)."""
    if isinstance(additional_config, dict):
        return int(additional_config.get(DATA_PARALLEL_SIZE_KEY, 1))
    return 1


def _additional(additional_config: object, key: str, env: str) -> object:
    value = additional_config.get(key) if isinstance(additional_config, dict) else None
    return (os.environ.get(env) or None) if value is None else value


def interleave_budget_options(additional_config: object = None) -> list[str]:
    """The interleaved-mode step budget options that are set (variable names)."""
    options = ((PREFILL_CHUNK_BUDGET_KEY, PREFILL_CHUNK_BUDGET_ENV), (PREFILL_TARGET_ITL_KEY, PREFILL_TARGET_ITL_ENV))
    return [env for key, env in options if _additional(additional_config, key, env) is not None]


def prefill_chunk_budget(additional_config: object = None) -> int | None:
    """Interleaved mode: a fixed number of prefill graph calls per engine step (see interleave.py); None: unset, the
    latency target decides."""
    value = _additional(additional_config, PREFILL_CHUNK_BUDGET_KEY, PREFILL_CHUNK_BUDGET_ENV)
    if value is None:
        return None
    try:
        budget = int(str(value).strip())
    except ValueError:
        budget = 0
    if budget < 1:
        raise ValueError(
            f"prefill chunk budget {value!r} is not allowed: set {PREFILL_CHUNK_BUDGET_ENV} (or additional_config "
            f"{PREFILL_CHUNK_BUDGET_KEY!r}) to a whole number of chunk calls per step, 1 or more"
        )
    return budget


def prefill_target_itl(additional_config: object = None) -> float | None:
    """Interleaved mode: the step time in seconds the prefill calls are fitted into (scheduler/step_budget.py); None: unset, the
    default (a decode step plus one chunk call)."""
    value = _additional(additional_config, PREFILL_TARGET_ITL_KEY, PREFILL_TARGET_ITL_ENV)
    if value is None:
        return None
    try:
        milliseconds = float(str(value).strip())
    except ValueError:
        milliseconds = 0.0
    if not milliseconds > 0 or milliseconds == float("inf"):
        raise ValueError(
            f"prefill target ITL {value!r} is not allowed: set {PREFILL_TARGET_ITL_ENV} (or additional_config "
            f"{PREFILL_TARGET_ITL_KEY!r}) to a step time in milliseconds above 0"
        )
    if prefill_chunk_budget(additional_config) is not None:
        raise ValueError(
            f"{PREFILL_TARGET_ITL_ENV} and {PREFILL_CHUNK_BUDGET_ENV} both set how much prompt a step prefills: set "
            f"the latency target ({PREFILL_TARGET_ITL_ENV} / {PREFILL_TARGET_ITL_KEY!r}) or the fixed number of chunk "
            f"calls ({PREFILL_CHUNK_BUDGET_ENV} / {PREFILL_CHUNK_BUDGET_KEY!r}), not both"
        )
    return milliseconds / 1000


def serves_on_neuron() -> bool:
    requested = backend_requested()
    return requested == "neuron" or (requested == "auto" and neuron_devices_present())
