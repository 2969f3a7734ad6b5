"""Compile backends: `cpu` (torch.export programs run on the host) and `neuron` (the Neuron SDK)."""

from __future__ import annotations

from pathlib import Path


def neuron_devices_present() -> bool:
    return any(Path("/dev").glob("neuron[0-9]*"))


def resolve_backend(name: str) -> str:
    """`auto` picks neuron when Neuron devices are present, else cpu."""
    if name == "auto":
        return "neuron" if neuron_devices_present() else "cpu"
    return name


def check_can_compile(neuron_config) -> None:
    """Fail before loading any weight when the backend cannot compile (e.g. the Neuron SDK is absent)."""
    if neuron_config.backend == "neuron":
        from . import neuron

        neuron.check_can_compile(neuron_config)


def compile_graphs(neuron_config, args, graphs, params, caches, directory: Path, progress) -> None:
    """Compile every graph into directory (the artifact being written)."""
    if neuron_config.backend == "neuron":
        from . import neuron

        neuron.compile_graphs(neuron_config, args, graphs, params, caches, directory, progress)
        return
    from . import cpu

    for graph in graphs:
        progress(f"compiling graph {graph.spec.name} [{graph.spec.rows} x {graph.spec.tokens}] with torch.export")
        cpu.compile_graph(graph, params, caches, cpu.graph_path(directory, graph.spec.name))


def load_graphs(neuron_config, args, names: list[str], params, caches, directory: Path):
    """A callable `(graph_name, *inputs) -> output` owning the weights and the KV cache."""
    if neuron_config.backend == "neuron":
        from . import neuron

        return neuron.NeuronGraphs(neuron_config, args, names, params, directory)
    from . import cpu

    return cpu.CpuGraphs(directory, names, params, caches)


def graph_files(neuron_config, directory: Path, names: list[str]) -> list[Path]:
    if neuron_config.backend == "neuron":
        from . import neuron

        return neuron.graph_files(directory)
    from . import cpu

    return [cpu.graph_path(directory, n) for n in names]


def compiler_version(neuron_config) -> dict:
    if neuron_config.backend == "neuron":
        from . import neuron

        return neuron.compiler_version()
    import torch

    return {"name": "torch.export", "version": torch.__version__}
