"""CPU backend: each graph exported with torch.export and kept as the exported program (replayed in C++ after its
first call, cpu_script.py) or compiled to C++ by AOTInductor, saved in the artifact and run on the host.

Weights and KV caches are graph inputs: programs hold no weights (the artifact stores them once)
and write the caller's cache tensors in place (index_copy_ stays an in-place op, in both forms).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from ..config import NeuronConfig
from ..errors import ArtifactError, ExportError
from ..graphs import DecoderGraph, GraphSpec, example_inputs
from ..models.collectives import GROUP_OPS
from ..torch_compat import aoti_compile_package, aoti_load_package
from . import Progress, join_gloo_group
from .compile_pool import SERIAL, CompileOptions
from .compile_pool import run as compile_with_pool
from .cpu_experts import use_expert_views
from .cpu_graph_record import check_inputs
from .cpu_linear import packable, use_packed_linears
from .cpu_script import Replay, traced_call
from .cpu_serde import load_program, save_program

GRAPH_DIR = "graphs"


@dataclass(frozen=True)
class ProgramFormat:
    """How one kind of CPU program is written and read back."""

    suffix: str
    description: str
    save: Callable[[torch.export.ExportedProgram, Path], None]
    load: Callable[[Path], Callable]
    # Attention runs through the ops whose CPU kernels read only the keys a call attends (cpu_attention.py), norms
    # and gated activations through one-pass kernels (cpu_pointwise.py); an AOTInductor package keeps the plain
    # forms, which it compiles (and fuses) itself.
    kernel_ops: bool


def _save_aoti(program: torch.export.ExportedProgram, path: Path) -> None:
    # Kernels read the thread count at run time: the artifact runs with any number of threads.
    aoti_compile_package(program, path, {"cpp.dynamic_threads": True})


FORMATS = {
    "inductor": ProgramFormat(
        ".aoti.pt2",
        "AOTInductor",
        _save_aoti,
        aoti_load_package,
        kernel_ops=False,
    ),
    "export": ProgramFormat(".pt2", "torch.export", save_program, load_program, kernel_ops=True),
}


class CpuBackend:
    name = "cpu"
    compiles_on_live_ranks = False
    shares_compile_cache = True  # ONP_CPU_COMPILE_CACHE
    # Host memory one compile worker needs besides the memory-mapped weights (tracing a graph of a 8B model), and the
    # graphs a worker must have to pay for its start (a graph traces in seconds; benchmark/graph_cases/compile_workers.py).
    worker_bytes = 4 * 1024**3
    graphs_per_worker = 8

    def __init__(self, neuron_config: NeuronConfig) -> None:
        self.neuron_config = neuron_config
        self.format = FORMATS[neuron_config.cpu_compiler]

    def check_can_compile(self) -> None:
        """torch is all it needs. Tensor-parallel programs are torch.export programs: their collectives name a
        process group that is rebound to the live one at load, which an AOTInductor package does not allow."""
        if self.neuron_config.tp_degree != 1 and self.neuron_config.cpu_compiler != "export":
            raise ExportError(
                f"tp_degree={self.neuron_config.tp_degree} needs --cpu-compiler export (AOTInductor packages cannot "
                "be bound to the serving process group); drop --cpu-compiler inductor or use --tensor-parallel-size 1"
            )

    def init_process_group(self, rank: int, world_size: int, init_method: str, timeout: timedelta) -> None:
        """Joins the tensor-parallel ranks: gloo, the programs' collectives run on host tensors."""
        join_gloo_group(rank, world_size, init_method, timeout)

    def graph_path(self, directory: Path, spec: GraphSpec) -> Path:
        return Path(directory) / GRAPH_DIR / f"{spec.key}{self.format.suffix}"

    def graph_files(self, directory: Path, specs: list[GraphSpec]) -> list[Path]:
        return [self.graph_path(directory, spec) for spec in specs]

    def compile(
        self,
        graphs: list[DecoderGraph],
        params: dict,
        caches: list[torch.Tensor],
        directory: Path,
        progress: Progress,
        options: CompileOptions = SERIAL,
    ) -> None:
        progress(f"compiling {len(graphs)} graph(s) with {self.format.description}")
        compile_with_pool(self, graphs, params, caches, directory, progress, options)

    def compiler_identity(self) -> tuple:
        return (self.format.suffix, torch.__version__)

    def worker_state(self, graphs: list[DecoderGraph], params: dict, caches: list, directory: Path, worker: int):
        return params, caches

    def compile_graph(self, graph: DecoderGraph, state, directory: Path) -> list[str]:
        params, caches = state
        path = self.graph_path(directory, graph.spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        graph.kernel_ops = self.format.kernel_ops
        with torch.no_grad(), _without_stack_traces():
            program = torch.export.export(graph, (params, caches, *example_inputs(graph.spec)), strict=False)
        self.format.save(program, path)
        return [str(path.relative_to(directory))]

    def load(self, graphs: list[DecoderGraph], params: dict, caches: list[torch.Tensor], directory: Path) -> CpuGraphs:
        programs = {g.spec: self._load_program(self.graph_path(directory, g.spec)) for g in graphs}
        packed, replayable = {}, set()
        for graph in graphs:
            program = programs[graph.spec]
            if graph.cc.degree > 1:
                bind_group(program, graph.cc.group)
            elif isinstance(program, torch.fx.GraphModule):
                replayable.add(graph.spec)  # collectives keep running from Python, as exported and rebound
            if isinstance(program, torch.fx.GraphModule):
                use_expert_views(program)
                if packable():
                    use_packed_linears(program, params, packed, graph.spec.computed_tokens)
        return CpuGraphs(programs, params, caches, replayable)

    def _load_program(self, path: Path) -> Callable:
        try:
            return self.format.load(path)
        except Exception as error:  # noqa: BLE001 - BadZipFile, unpickling or version errors all mean "re-export"
            raise ArtifactError(f"{path}: cannot load the compiled graph ({error}); export the model again") from None

    def versions(self) -> dict:
        return {"name": self.format.description, "version": torch.__version__}


@contextlib.contextmanager
def _without_stack_traces() -> Iterator[None]:
    """Tracing records the Python stack of every node (a tenth of an export's time, and the bulk of each saved node's
    metadata); the programs run without it. torch.fx.config documents the switch for this."""
    saved = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = saved


def bind_group(module: torch.fx.GraphModule, group: str) -> None:
    """Points every collective of an exported program at the live process group `group` (by name).

    The program was traced on export_world's fake group: its collectives name that group, which does not exist
    in the serving process. The group size is recorded too and was checked against tp_degree at load."""
    for submodule in module.modules():
        if not isinstance(submodule, torch.fx.GraphModule):
            continue
        nodes = [n for n in submodule.graph.nodes if n.op == "call_function" and n.target in GROUP_OPS]
        for node in nodes:
            node.args = (*node.args[:-1], group)
        if nodes:
            submodule.recompile()


class CpuGraphs:
    """Loaded programs plus the state they share: weights and the KV cache.

    Each exported program's first call is traced and later calls replay the trace (cpu_script.py), except
    tensor-parallel programs and AOTInductor packages."""

    def __init__(
        self,
        programs: dict[GraphSpec, Callable],
        params: dict,
        caches: list[torch.Tensor],
        replayable: set[GraphSpec],
    ) -> None:
        self.programs, self.params, self.caches = programs, params, caches
        self.uncalled, self.replayable = set(programs), replayable
        self.traces: dict[GraphSpec, Replay] = {}

    def __call__(self, spec: GraphSpec, *inputs: torch.Tensor) -> torch.Tensor:
        program, args = self.programs[spec], (self.params, self.caches, *inputs)
        with torch.inference_mode():
            if spec in self.traces:
                return self.traces[spec](*args)
            if spec in self.uncalled:
                return self._first_call(spec, program, args)
            return program(*args)

    def _first_call(self, spec: GraphSpec, program: Callable, args: tuple) -> torch.Tensor:
        if spec in self.replayable:
            check_inputs(program, args)  # here, not under the trace, which would record every size it reads
            program.validate_inputs = False
            output, replay = traced_call(program, args)
            if replay is not None:
                self.traces[spec] = replay
        else:
            output = program(*args)
        # An exported module checks every input against the shapes it was traced with: the first call (the
        # warm-up) keeps that check, which catches a graph file of another export. Later calls skip it: it
        # walks every weight and cache tensor in Python (milliseconds per decode step), and the runtime
        # fixes every shape.
        self.uncalled.discard(spec)
        if isinstance(program, torch.nn.Module):
            program.validate_inputs = False
        return output
