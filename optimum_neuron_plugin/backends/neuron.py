"""Neuron backend on TorchNeuron (torch-neuronx 2.13.3, Neuron SDK 2.33+, Trn2/Trn3).

- Each graph (one per graph kind and context bucket) is `torch.compile(graph, backend="neuron",
  fullgraph=True, dynamic=False)`: TorchDynamo -> AOTAutograd -> StableHLO -> neuronx-cc -> NEFF.
- Weights and the KV cache are moved once to the `neuron` device and passed to every graph call as
  inputs that stay there; per call only ids, positions, seq ids and sampling inputs cross from the host.
  The graphs write the cache with index_copy_ on a view of it, which TorchNeuron keeps as an input
  mutation aliased to an output (models/kv_cache.py): the cache is updated in place on the device.
- Export compiles every graph once; TorchNeuron's persistent NEFF cache is pointed inside the artifact
  (graphs/neuron-cache), and graphs/<key>.neuron.json lists the cache files each graph added. Loading the
  artifact traces the graphs again (seconds) and finds every NEFF in that cache: `vllm serve` runs no
  neuronx-cc.
- Compiling needs the device: TorchNeuron reads the compilation target from the Neuron runtime
  (nrt_get_instance_info) with no override, and compiles graphs called on "neuron" tensors, which only exist on a
  device host. NEURON_PLATFORM_TARGET_OVERRIDE (NKI) and VLLM_NEURON_CPU_COMPILE (vLLM Neuron, through its own
  libtorch-neuronx-lite) do not reach torch-neuronx's backend. An export on a host without NeuronCores is refused
  at once (NO_CPU_COMPILE says why).
- Tensor parallelism (tp_degree N > 1): the graphs' functional collectives are compiled for a live process group,
  so the export runs N rank processes, one per NeuronCore (backends/neuron_ranks.py), each compiling every graph
  on its shard in lockstep; serving runs N vLLM workers the same way. TorchNeuron's cache keys do not depend on
  the rank, so the ranks share one NEFF cache.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from importlib import metadata
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import NEURON_CONFIG_FILE, NeuronConfig
from ..errors import ArtifactError, ExportError
from ..graphs import DecoderGraph, GraphSpec, example_inputs
from ..placement import Rank, neuron_core, parse_cores
from . import Progress, join_device_group, join_gloo_group, neuron_devices_present
from .compile_pool import SERIAL, CompileOptions
from .compile_pool import run as compile_with_pool

logger = logging.getLogger(__name__)

GRAPH_DIR = "graphs"
CACHE_DIR = "neuron-cache"  # under GRAPH_DIR
WORKER_DIR = ".compile-workers"
# The NeuronCores an export could use before it pinned itself to the first: its compile workers take one each.
EXPORT_CORES_ENV = "ONP_EXPORT_CORES"  # a compile worker's own NEFF cache: <WORKER_DIR>/<worker>/graphs/neuron-cache
# TorchNeuron's persistent NEFF cache directory (csrc/core/cache/PersistentCacheBackend.cpp).
CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
# TorchNeuron's optimisation level for torch.compile graphs when NEURON_COMPILER_OPT_LEVEL is unset.
DEFAULT_OPT_LEVEL = "-O2"
# distribution -> module
COMPILE_PACKAGES = {"torch-neuronx": "torch_neuronx", "neuronx-cc": "neuronxcc"}
RUNTIME_PACKAGES = {"torch-neuronx": "torch_neuronx"}
INSTALL = (
    'scripts/setup-neuron.sh (pip install ".[neuron]" from the Neuron pip repository) on a trn2/trn3 host with '
    "Ubuntu 26.04 and Python 3.12-3.14 (Neuron SDK 2.33, docs/neuron.md)"
)
WHERE = "run it on a trn2 or trn3 instance (Neuron SDK 2.33+), or use --backend cpu"
NO_CPU_COMPILE = (
    "an export with --backend neuron compiles on the device host, --instance-type or not (TorchNeuron takes the "
    "compilation target from the Neuron runtime and has no CPU compile mode; NEURON_PLATFORM_TARGET_OVERRIDE and "
    "VLLM_NEURON_CPU_COMPILE belong to NKI and vLLM Neuron): "
)


@dataclass(frozen=True)
class Peers:
    """The ranks compiling the same graphs together (tensor parallelism); alone by default.
    `group` is a gloo group: barriers on host tensors, whatever backend the graphs' collectives use."""

    rank: int = 0
    group: dist.ProcessGroup | None = None

    def barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)


ALONE = Peers()


class NeuronBackend:
    """`compiler` names the Dynamo backend (TorchNeuron registers "neuron") and `device` the torch device
    the weights and cache live on. `compiler_module`, when given, is imported before `compiler` is looked up, in
    this process and in every rank process of a tensor-parallel export: a module registering another Dynamo
    backend under that name (the tests' stand-in compiler, which runs on device "cpu"), and possibly the
    torch.distributed backend named by `process_group` (the tests' stand-in for TorchNeuron's "neuron" group)."""

    name = "neuron"
    compiles_on_live_ranks = True  # TorchNeuron lowers collectives against the live group
    shares_compile_cache = False  # TorchNeuron's NEFF cache is the shared one
    # Host memory one compile worker needs: neuronx-cc on a graph of an 8B model (an estimate; the export's summary
    # reports the time per graph, --compile-workers overrides it).
    worker_bytes = 16 * 1024**3
    graphs_per_worker = 1  # a graph compiles in minutes

    def __init__(
        self,
        neuron_config: NeuronConfig,
        compiler: str = "neuron",
        device: str = "neuron",
        compiler_module: str | None = None,
        process_group: str | None = None,
    ) -> None:
        self.neuron_config, self.compiler, self.device = neuron_config, compiler, device
        self.compiler_module = compiler_module
        # The torch.distributed backend of the ranks' group: TorchNeuron's on the device, gloo on the cpu device.
        self.process_group = process_group or ("neuron" if device == "neuron" else "gloo")

    def check_can_compile(self) -> None:
        if self.device == "neuron":
            _require(COMPILE_PACKAGES, ExportError)
            _require_cores(ExportError, NO_CPU_COMPILE)
            if not dist.is_initialized():  # the exporting process; a rank process sees its one pinned core
                _require_tp_cores(self.neuron_config.tp_degree)
                if self.neuron_config.tp_degree == 1:  # compiles here, not on rank processes
                    _pin_export_core()
            _check_target(self.neuron_config)
        self._require_compiler(ExportError)

    def init_process_group(self, rank: int, world_size: int, init_method: str, timeout: timedelta) -> None:
        """Joins the tensor-parallel ranks, before the first use of the device. The world is TorchNeuron's "neuron"
        group, for the graphs' collectives on device tensors; host tensors go over a gloo group beside it
        (backends.host_group). The cpu device (tests) joins `process_group`: gloo, or a stand-in for "neuron"."""
        if self.device == "neuron":
            import torch_neuronx  # noqa: F401 - registers the "neuron" process group backend

            # The ranks of a group are the NeuronCores of one host (pin_cores chose this process's core): TorchNeuron
            # takes its local rank from these instead of matching host addresses through the store.
            os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"] = str(rank), str(world_size)
        elif self.compiler_module:
            importlib.import_module(self.compiler_module)  # may register a stand-in process group backend
        if self.process_group == "gloo":
            join_gloo_group(rank, world_size, init_method, timeout)
        else:
            join_device_group(self.process_group, rank, world_size, init_method, timeout)

    def graph_files(self, directory: Path, specs: list[GraphSpec]) -> list[Path]:
        """Each graph's manifest, then the cache files it lists (once the manifest exists)."""
        graphs = Path(directory) / GRAPH_DIR
        files = []
        for spec in specs:
            manifest = graphs / f"{spec.key}.neuron.json"
            files.append(manifest)
            if manifest.is_file():
                files += [graphs / name for name in _read_manifest(manifest)["cache_files"]]
        return list(dict.fromkeys(files))

    def compile(
        self,
        graphs: list[DecoderGraph],
        params: dict,
        caches: list[torch.Tensor],
        directory: Path,
        progress: Progress,
        peers: Peers = ALONE,
        options: CompileOptions = SERIAL,
    ) -> None:
        """Compiles every graph by calling it once. Alone (tensor parallelism 1) through compile_pool: graphs already
        in the export's resume directory are copied, the others compiled here or in `options.workers` processes.
        Under tensor parallelism every rank calls this with its shard and the same graphs in the same order (`peers`):
        rank 0 writes each graph's manifest once every rank's cache files for it are written, and before any rank
        starts the next graph."""
        self.check_can_compile()
        if peers.group is None:
            _require_worker_cores(self, min(options.workers, len(graphs)))
            progress(f"compiling {len(graphs)} graph(s) with torch.compile(backend={self.compiler!r})")
            compile_with_pool(self, graphs, params, caches, directory, progress, options)
            return
        cache = _use_cache(directory)
        device_graphs = NeuronGraphs(self, graphs, params, caches)
        listed = _files_under(cache)
        peers.barrier()
        for graph in graphs:
            spec = graph.spec
            progress(
                f"compiling graph {spec.key} [{spec.rows} x {spec.tokens}] with torch.compile(backend={self.compiler!r})"
            )
            _call(device_graphs, spec)
            peers.barrier()
            if peers.rank == 0:
                listed |= _write_manifest(spec, cache, _files_under(cache) - listed, cache)
            peers.barrier()

    def compiler_identity(self) -> tuple:
        """The versions besides the options, target and LNC: TorchNeuron's own NEFF cache key holds no version."""
        return tuple(sorted(self.versions().items()))

    def worker_state(self, graphs: list[DecoderGraph], params: dict, caches: list, directory: Path, worker: int):
        """The exporting process compiles into the artifact's NEFF cache itself (it may load the graphs next). A worker
        process takes NeuronCore `worker` (TorchNeuron compiles graphs called on a device; the runtime claims every
        visible core otherwise) and a NEFF cache of its own: TorchNeuron reads CACHE_ENV once per process, and files
        it adds there belong to the graph it just compiled."""
        if worker < 0:
            cache = _use_cache(directory)
        else:
            if self.device == "neuron":  # before this process starts the runtime
                os.environ["NEURON_RT_VISIBLE_CORES"] = str(_export_cores()[worker])
            self._require_compiler(ExportError)  # this process's Dynamo backends (a stand-in registers its own)
            cache = _use_cache(Path(directory) / WORKER_DIR / str(worker))
        return NeuronGraphs(self, graphs, params, caches), cache

    def compile_graph(self, graph: DecoderGraph, state, directory: Path) -> list[str]:
        """Calls the graph once; its new NEFF cache files move to the artifact's cache, listed by its manifest."""
        device_graphs, cache = state
        before = _files_under(cache)
        _call(device_graphs, graph.spec)
        shared = Path(directory) / GRAPH_DIR / CACHE_DIR
        added = _files_under(cache) - before
        if cache != shared:
            moved = set()
            for path in added:
                target = shared / path.relative_to(cache)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
                moved.add(target)
            added = moved
        _write_manifest(graph.spec, shared, added, cache)
        names = [f"{graph.spec.key}.neuron.json", *sorted(str(p.relative_to(shared.parent)) for p in added)]
        return [f"{GRAPH_DIR}/{name}" for name in names]

    def load(
        self, graphs: list[DecoderGraph], params: dict, caches: list[torch.Tensor], directory: Path
    ) -> NeuronGraphs:
        if self.device == "neuron":
            _require(RUNTIME_PACKAGES, ArtifactError)
            _require_cores(ArtifactError, "")
            _check_compiled_here(Path(directory), self.versions())
        self._require_compiler(ArtifactError)
        return NeuronGraphs(self, graphs, params, caches, loaded_from=_use_cache(directory))

    def versions(self) -> dict:
        """What compiled the graphs and for which cores (stored under "compiler" in neuron_config.json)."""
        versions = {
            "name": "torch-neuronx",
            "torch_neuronx": _version("torch-neuronx"),
            "neuronx_cc": _version("neuronx-cc"),
            "target": None,
            "logical_nc_config": os.environ.get("NEURON_LOGICAL_NC_CONFIG"),
            **compile_options(),
        }
        if self.device == "neuron" and _installed("torch_neuronx"):
            from torch_neuronx.utils import get_logical_neuron_cores, get_platform_target

            versions.update(target=get_platform_target(), logical_nc_config=str(get_logical_neuron_cores()))
        return versions

    def _require_compiler(self, error: type[Exception]) -> None:
        if self.compiler_module:
            importlib.import_module(self.compiler_module)
        # torch-neuronx registers "neuron" through the torch_dynamo_backends entry point group.
        if self.compiler not in torch.compiler.list_backends(exclude_tags=()):
            raise error(
                f"no torch.compile backend named {self.compiler!r}: the neuron backend needs torch-neuronx; {INSTALL}"
            )


class NeuronGraphs:
    """Every graph compiled for the device, with the weights and the KV cache moved there once."""

    # Graphs built in this process, an earlier model's (a test, a second export) included: each is a Dynamo cache
    # entry of the same code object (DecoderGraph.forward), and the recompile limit must cover them all.
    built_in_process = 0

    def __init__(
        self,
        backend: NeuronBackend,
        graphs: list[DecoderGraph],
        params: dict,
        caches: list[torch.Tensor],
        loaded_from: Path | None = None,
    ) -> None:
        # The artifact's NEFF cache: a graph's first call finds its NEFF there, or warns that it compiled one.
        self.cache, self.unchecked = loaded_from, {g.spec for g in graphs} if loaded_from else set()
        self.device = torch.device(backend.device)
        self.params = {name: tensor.to(self.device) for name, tensor in params.items()}
        self.caches = [cache.to(self.device) for cache in caches]
        self.compiled = {
            g.spec: torch.compile(g.to(self.device), backend=backend.compiler, fullgraph=True, dynamic=False)
            for g in graphs
        }
        NeuronGraphs.built_in_process += len(graphs)

    def __call__(self, spec: GraphSpec, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        # Row-major like the example inputs: Dynamo guards every stride (a [rows, 1] transposed view traces again).
        inputs = [x.clone(memory_format=torch.contiguous_format).to(self.device) for x in inputs]
        before = _files_under(self.cache) if spec in self.unchecked else None
        # Every graph shares one code object (DecoderGraph.forward): Dynamo keeps one cache entry per distinct graph.
        with torch.no_grad(), _dynamo_limit(NeuronGraphs.built_in_process):
            output = self.compiled[spec](self.params, self.caches, *inputs)
        if before is not None:
            self.unchecked.discard(spec)
            if _files_under(self.cache) - before:
                logger.warning(
                    "graph %s was not in %s and was compiled at load time; export again", spec.key, self.cache
                )
        # chunk_and_decode with on-device sampling returns (chunk logits, token ids).
        return tuple(x.cpu() for x in output) if isinstance(output, tuple) else output.cpu()


def _call(device_graphs: NeuronGraphs, spec: GraphSpec) -> None:
    try:
        device_graphs(spec, *example_inputs(spec))
    except Exception as error:  # noqa: BLE001 - Dynamo, StableHLO lowering and neuronx-cc errors
        message = " ".join(str(error).split())[:500]
        raise ExportError(f"compiling graph {spec.key} failed ({message}); see the log above") from None


def _write_manifest(spec: GraphSpec, cache: Path, added: set[Path], where: Path) -> set[Path]:
    """graphs/<key>.neuron.json: the files under `cache` compiling `spec` (in NEFF cache `where`) added."""
    _require_neff(spec, added, where)
    manifest = {"graph": spec.key, "cache_files": sorted(str(p.relative_to(cache.parent)) for p in added)}
    (cache.parent / f"{spec.key}.neuron.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return added


def _require_neff(spec: GraphSpec, added: set[Path], cache: Path) -> None:
    """A graph compiled but its NEFF is not in the artifact: vllm serve would compile it again, on the device host."""
    if not any(path.suffix == ".neff" for path in added):
        raise ExportError(
            f"compiling graph {spec.key} left no .neff in {cache}: TorchNeuron's NEFF cache is elsewhere (it reads "
            f"{CACHE_ENV} once per process, so it was created before this export set it; or "
            "TORCH_NEURONX_NEFF_DISABLE_CACHE=1 is set). Export in a fresh process (optimum-cli export neuron) "
            "without TORCH_NEURONX_NEFF_DISABLE_CACHE"
        )


@contextmanager
def _dynamo_limit(entries: int):
    with torch.compiler.config.patch(recompile_limit=max(entries, torch.compiler.config.recompile_limit)):
        yield


def _use_cache(directory: Path) -> Path:
    """Points TorchNeuron's persistent NEFF cache at the artifact. TorchNeuron reads the variable when it
    creates its cache, so this comes before the first compile of the process."""
    cache = Path(directory) / GRAPH_DIR / CACHE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_ENV] = str(cache)
    # A graph that fails to compile raises instead of running eagerly on the host (the SDK 2.33 default).
    os.environ.setdefault("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "1")
    return cache


def _files_under(directory: Path) -> set[Path]:
    return {p for p in directory.rglob("*") if p.is_file()}


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
        if isinstance(manifest.get("cache_files"), list):
            return manifest
    except (OSError, json.JSONDecodeError, AttributeError):
        pass
    raise ArtifactError(f"{path}: unreadable graph manifest; export the model again")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _require(packages: dict[str, str], error: type[Exception]) -> None:
    missing = [dist for dist, module in packages.items() if not _installed(module)]
    if missing:
        raise error(
            f"the neuron backend needs {' and '.join(missing)} (not installed): {INSTALL}; or use --backend cpu"
        )


def neuron_core_count() -> int:
    """NeuronCores (logical, as torch-neuronx counts them) visible to this process; 0 without the SDK or devices."""
    if not neuron_devices_present() or not _installed("torch_neuronx"):
        return 0
    import torch_neuronx

    return torch_neuronx.device_count()


def pin_cores(rank: Rank) -> None:
    """Gives this process the NeuronCore of `rank` only (placement.neuron_core: its place among the cores
    NEURON_RT_VISIBLE_CORES lists, else among all): the Neuron runtime otherwise claims every core it sees.
    Must run before the runtime starts (first device use)."""
    os.environ["NEURON_RT_VISIBLE_CORES"] = str(neuron_core(rank, os.environ.get("NEURON_RT_VISIBLE_CORES")))


def _pin_export_core() -> None:
    """A tensor-parallel-1 export compiles in its own process: it takes the first visible NeuronCore only, as every
    rank does, instead of the runtime's default of every core of the instance (a server on other cores keeps them).
    Only before this process starts the runtime: the runtime reads NEURON_RT_VISIBLE_CORES when it starts. The cores
    it could see are kept in EXPORT_CORES_ENV for its compile workers (one core each)."""
    import torch_neuronx

    if not torch_neuronx.is_neuron_runtime_initialized():
        if EXPORT_CORES_ENV not in os.environ:
            visible = os.environ.get("NEURON_RT_VISIBLE_CORES")
            cores = parse_cores(visible) if visible else list(range(neuron_core_count()))
            os.environ[EXPORT_CORES_ENV] = ",".join(map(str, cores))
        pin_cores(Rank())


def _export_cores() -> list[int]:
    """The NeuronCores the export may use (before it pinned itself to the first)."""
    kept = os.environ.get(EXPORT_CORES_ENV)
    if kept is not None:
        return [int(core) for core in kept.split(",") if core]
    visible = os.environ.get("NEURON_RT_VISIBLE_CORES")
    return parse_cores(visible) if visible else list(range(neuron_core_count()))


def _require_cores(error: type[Exception], context: str) -> None:
    if neuron_core_count() == 0:
        raise error(f"{context}no NeuronCore is visible on this host (/dev/neuron*, NEURON_RT_VISIBLE_CORES): {WHERE}")


def _require_worker_cores(backend: NeuronBackend, workers: int) -> None:
    """Compile workers each compile on a NeuronCore of their own (TorchNeuron compiles graphs called on a device)."""
    if backend.device != "neuron" or workers <= 1:
        return
    cores = len(_export_cores())
    if cores < workers:
        raise ExportError(
            f"--compile-workers {workers} compiles on {workers} NeuronCores (one process each) but {cores} are "
            "visible (NEURON_RT_VISIBLE_CORES): lower --compile-workers"
        )


def _require_tp_cores(degree: int) -> None:
    """A tensor-parallel export compiles on `degree` NeuronCores, one rank process each."""
    cores = neuron_core_count()
    if cores < degree:
        raise ExportError(
            f"tp_degree={degree} compiles on {degree} NeuronCores (one process each) but {cores} are visible "
            "(NEURON_RT_VISIBLE_CORES): make more cores visible or lower --tensor-parallel-size"
        )


def _check_target(neuron_config: NeuronConfig) -> None:
    from ..devices import HostQueryError, host_instance_type

    try:
        host = host_instance_type()
    except HostQueryError as error:
        raise ExportError(f"{error}: {WHERE}") from None
    if neuron_config.target and neuron_config.target != host:
        raise ExportError(
            f"--instance-type {neuron_config.target} does not match this host ({host}): TorchNeuron compiles for the "
            f"device it runs on; export on a {neuron_config.target} instance or drop --instance-type"
        )


# The arguments TorchNeuron gives neuronx-cc for torch.compile graphs before NEURON_CC_FLAGS (its cache key holds them).
TORCH_COMPILE_ARGUMENTS = "--model-type transformer --auto-cast=none"


def compile_options() -> dict:
    """The compiler options TorchNeuron puts in each NEFF's cache key besides the graph, target and LNC, as this
    process gives them (csrc/core/KernelExecution.cpp, CompileOnlyKernelExecution): NEURON_CC_FLAGS as it is, None
    when unset (set, even to "" or with extra spaces, it is appended to the key after a space), and the opt level
    (NEURON_COMPILER_OPT_LEVEL, -O2 when unset). A serving process with other values looks the graphs up under other
    keys and compiles them again."""
    return {
        "neuron_cc_flags": os.environ.get("NEURON_CC_FLAGS"),
        "opt_level": os.environ.get("NEURON_COMPILER_OPT_LEVEL", DEFAULT_OPT_LEVEL),
    }


def cache_key_options(options: dict) -> str:
    """The part of TorchNeuron's NEFF cache key that `options` (compile_options) make, as CreateCompilerExtensionHash
    builds it: the opt level without its leading dash, then TorchNeuron's own arguments and NEURON_CC_FLAGS with each
    space written "_" and each "=" written "-"."""
    flags = options.get("neuron_cc_flags")
    arguments = TORCH_COMPILE_ARGUMENTS + ("" if flags is None else " " + flags)
    level = options.get("opt_level")
    level = DEFAULT_OPT_LEVEL if level is None else level
    return level.removeprefix("-") + "_" + arguments.replace(" ", "_").replace("=", "-")


def _check_compiled_here(directory: Path, host: dict) -> None:
    """Refuses NEFFs built for another target or with other compiler options (TorchNeuron would look them up under
    other cache keys and compile every graph again at serve time) or by another compiler (the versions are not in
    the key: they would be loaded as they are)."""
    path = directory / NEURON_CONFIG_FILE
    if not path.is_file():
        return  # the export's own working directory, just compiled on this host
    built = json.loads(path.read_text()).get("compiler") or {}
    checks = (
        ("target", "target"),
        ("logical_nc_config", "NEURON_LOGICAL_NC_CONFIG"),
        ("torch_neuronx", "torch-neuronx"),
        ("neuronx_cc", "neuronx-cc"),
    )
    for key, what in checks:
        if built.get(key) != host.get(key):
            raise ArtifactError(
                f"{directory}: compiled with {what} {built.get(key)}, this host has {host.get(key)}; export the model "
                "again on this host (optimum-cli export neuron --backend neuron)"
            )
    if cache_key_options(built) != cache_key_options(host):
        differ = [
            (variable, built.get(key), host.get(key))
            for key, variable in (("neuron_cc_flags", "NEURON_CC_FLAGS"), ("opt_level", "NEURON_COMPILER_OPT_LEVEL"))
            if built.get(key) != host.get(key)
        ]
        was = ", ".join(f"{variable}={_shown(b)}, this process has {_shown(h)}" for variable, b, h in differ)
        fix = " ".join(_setting(variable, b) for variable, b, _ in differ)
        raise ArtifactError(
            f"{directory}: compiled with {was}: TorchNeuron looks the graphs up by these exact values; run vllm serve "
            f"with `{fix}`, or export the model again with this process's options"
        )


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value)


def _setting(variable: str, value: str | None) -> str:
    """A shell command giving `variable` exactly `value` (None: unset)."""
    import shlex

    return f"unset {variable};" if value is None else f"export {variable}={shlex.quote(value)};"


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
