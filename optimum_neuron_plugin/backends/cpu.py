"""CPU backend: each graph is a torch.export program saved in the artifact and run on the host.

Weights and KV caches are graph inputs: programs hold no weights (the artifact stores them
once) and write the caller's cache tensors in place (index_copy_ stays an in-place op).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import ArtifactError
from ..graphs import DecoderGraph, example_inputs

GRAPH_DIR = "graphs"
SUFFIX = ".pt2"


def graph_path(directory: Path, name: str) -> Path:
    return Path(directory) / GRAPH_DIR / f"{name}{SUFFIX}"


def compile_graph(graph: DecoderGraph, params: dict, caches: list[torch.Tensor], path: Path) -> None:
    args = (params, caches, *example_inputs(graph.spec))
    with torch.no_grad():
        program = torch.export.export(graph, args, strict=False)
    # The program would otherwise save its example inputs: a full copy of the weights per graph.
    program._example_inputs = None
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))


def _load(path: Path) -> Callable:
    try:
        return torch.export.load(str(path)).module()
    except Exception as error:  # noqa: BLE001 - BadZipFile, unpickling or version errors all mean "re-export"
        raise ArtifactError(f"{path}: cannot load the compiled graph ({error}); export the model again") from None


class CpuGraphs:
    """Loaded programs plus the state they share: weights and the KV cache."""

    def __init__(self, directory: Path, names: list[str], params: dict, caches: list[torch.Tensor]) -> None:
        self.params, self.caches = params, caches
        self.programs: dict[str, Callable] = {n: _load(graph_path(directory, n)) for n in names}

    def __call__(self, name: str, *inputs: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.programs[name](self.params, self.caches, *inputs)
