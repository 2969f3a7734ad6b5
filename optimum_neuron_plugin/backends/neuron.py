"""Neuron backend: the shared graphs compiled into NEFFs by the Neuron SDK (neuronx-distributed ModelBuilder).

- One module, DeviceDecoder, holds the weights as parameters (named like the checkpoint) and the KV cache as
  buffers; each graph is traced from it under its own tag and all of them are saved in one NxDModel
  (graphs/nxd_model.pt). The NEFFs hold no weights: the artifact's model.safetensors is the only copy.
- KV cache: a graph writes clones of the cache buffers and reassigns them, the out-of-place buffer update that
  ModelBuilder turns into input/output aliasing. The cache is device state shared by every graph, updated in
  place, never passed from the host.
- Weights: loaded once per process (NxDModel.set_weights + to_neuron) and shared by all graphs.
- token_generation is the priority model: its weight layout is optimized and the other graphs adopt it.
- Target: neuron_config.target (inf2; trn1 and trn1n -> trn1; trn2), else the host's Neuron platform. Logical
  NeuronCores: NEURON_LOGICAL_NC_CONFIG if set, else 2 on trn2 and 1 elsewhere (must match the runtime's).

Needs Neuron SDK 2.27+ (neuronx-distributed 0.16+: ModelBuilder V2, NxDModel.save/load), torch-neuronx, neuronx-cc.

Supported: tp_degree 1 (one NeuronCore, or one logical NeuronCore on trn2). Not supported: tp_degree > 1. The
shared model uses plain tensors; sharding it needs neuronx-distributed parallel layers (column/row-parallel
projections, sharded KV heads and collectives) in models/, so both export and load raise for tp_degree > 1.
"""

from __future__ import annotations

import importlib.util
import os
from importlib import metadata
from pathlib import Path

import torch
from torch import nn

from ..errors import ArtifactError, ExportError
from ..graphs import TOKEN_GENERATION, DecoderGraph, GraphSpec, example_inputs
from . import neuron_devices_present

MODEL_FILE = Path("graphs") / "nxd_model.pt"
INPUT_NAMES = ("input_ids", "position_ids", "seq_ids", "sampling_params", "uniform")
TARGETS = {"inf2": "inf2", "trn1": "trn1", "trn1n": "trn1", "trn2": "trn2"}
# distribution name -> module name
COMPILE_PACKAGES = {
    "torch-neuronx": "torch_neuronx",
    "neuronx-distributed": "neuronx_distributed",
    "neuronx-cc": "neuronxcc",
}
RUNTIME_PACKAGES = {"torch-neuronx": "torch_neuronx", "neuronx-distributed": "neuronx_distributed"}
SDK = "the Neuron SDK pip repository (pip install --extra-index-url https://pip.repos.neuron.amazonaws.com {}) or a Neuron DLAMI"


class NeuronBackend:
    name = "neuron"

    def __init__(self, neuron_config) -> None:
        self.neuron_config = neuron_config

    def check_can_compile(self) -> None:
        check_can_compile(self.neuron_config)

    def compile(self, graphs, params, caches, directory: Path, progress) -> None:
        compile_graphs(self.neuron_config, graphs, params, caches, directory, progress)

    def graph_files(self, directory: Path, specs: list[GraphSpec]) -> list[Path]:
        return [Path(directory) / MODEL_FILE]

    def load(self, graphs, params, caches, directory: Path) -> NeuronGraphs:
        return NeuronGraphs(self.neuron_config, graphs, params, directory)

    def versions(self) -> dict:
        return {"name": "neuronx-cc", "version": _version("neuronx-cc")}


class DeviceDecoder(nn.Module):
    """Weights (parameters) and KV cache (buffers kv_cache_<i>) around the DecoderGraph named by `active`."""

    def __init__(self, graphs: list[DecoderGraph], params: dict[str, torch.Tensor], caches: list[torch.Tensor]):
        super().__init__()
        self.graphs = nn.ModuleDict({graph.spec.key: graph for graph in graphs})
        self.active = graphs[0].spec.key
        self.weight_names = list(params)
        for name, tensor in params.items():
            *path, leaf = name.split(".")
            module = self
            for part in path:
                if part not in module._modules:
                    module.add_module(part, nn.Module())
                module = module._modules[part]
            module.register_parameter(leaf, nn.Parameter(tensor, requires_grad=False))
        self.num_caches = len(caches)
        for i, cache in enumerate(caches):
            self.register_buffer(f"kv_cache_{i}", cache)

    def forward(self, input_ids, position_ids, seq_ids, sampling_params=None, uniform=None):
        params = {name: self.get_parameter(name) for name in self.weight_names}
        caches = [getattr(self, f"kv_cache_{i}").clone() for i in range(self.num_caches)]
        extra = () if sampling_params is None else (sampling_params, uniform)
        output = self.graphs[self.active](params, caches, input_ids, position_ids, seq_ids, *extra)
        for i, cache in enumerate(caches):
            setattr(self, f"kv_cache_{i}", cache)
        return output

    def checkpoint(self) -> dict[str, torch.Tensor]:
        """What NxDModel.set_weights loads: every parameter and constant buffer, not the cache (device state)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("kv_cache_")}


def compiler_args(graph_name: str, target: str) -> str:
    lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG") or (2 if target == "trn2" else 1))
    level = "-O2" if graph_name == TOKEN_GENERATION else "-O1"
    return (
        f"--target {target} --lnc={lnc} --model-type=transformer --auto-cast=none {level} "
        "--enable-saturate-infinity --enable-mixed-precision-accumulation"
    )


def check_can_compile(neuron_config) -> None:
    """Everything compile_graphs needs, checked before any weight is loaded."""
    _check_tp(neuron_config, ExportError)
    _require(COMPILE_PACKAGES, ExportError, "or use --backend cpu")
    _nxd(ExportError)
    _target(neuron_config)


def compile_graphs(neuron_config, graphs, params, caches, directory: Path, progress) -> None:
    check_can_compile(neuron_config)
    ModelBuilder, _ = _nxd(ExportError)
    target = _target(neuron_config)
    decoder = DeviceDecoder(graphs, params, caches)
    builder = ModelBuilder(decoder)
    names = [graph.spec.key for graph in graphs]
    workdir = Path(directory) / "neuronx-cc"
    try:
        for graph in graphs:
            spec = graph.spec
            progress(f"tracing graph {spec.key} [{spec.rows} x {spec.tokens}] for {target}")
            decoder.active = spec.key
            builder.trace(kwargs=dict(zip(INPUT_NAMES, example_inputs(spec), strict=False)), tag=spec.key)
        progress(f"compiling {', '.join(names)} with neuronx-cc for {target} (logs in {workdir})")
        nxd_model = builder.compile(
            priority_model_key=next((g.spec.key for g in graphs if g.spec.name == TOKEN_GENERATION), None),
            compiler_workdir=str(workdir),
            compiler_args={g.spec.key: compiler_args(g.spec.name, target) for g in graphs},
        )
    except RuntimeError as error:
        causes, cause = [], error
        while cause is not None and len(causes) < 4:
            causes.append(" ".join(str(cause).split()))
            cause = cause.__cause__
        raise ExportError(
            f"the Neuron SDK failed to build the graphs ({': '.join(causes)}); compiler logs are in {workdir}"
        ) from None
    path = Path(directory) / MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    nxd_model.save(str(path))


class NeuronGraphs:
    """The NxDModel of every graph; weights and KV cache live on the device. Loaded lazily without a device
    (an export compiled for a target on a host without Neuron devices still saves its artifact)."""

    def __init__(self, neuron_config, graphs: list[DecoderGraph], params: dict, directory: Path) -> None:
        _check_tp(neuron_config, ArtifactError)
        _require(RUNTIME_PACKAGES, ArtifactError, "or export the model again with --backend cpu")
        self.neuron_config, self.graphs, self.params = neuron_config, graphs, params
        self.names = [graph.spec.key for graph in graphs]
        self.path = Path(directory) / MODEL_FILE
        self.model = self._load() if neuron_devices_present() else None

    def _load(self):
        _, NxDModel = _nxd(ArtifactError)
        model = NxDModel.load(str(self.path))
        if not isinstance(model, NxDModel):
            raise ArtifactError(f"{self.path}: written by an incompatible neuronx-distributed; export the model again")
        missing = set(self.names) - model.get_available_keys()
        if missing:
            raise ArtifactError(f"{self.path}: lacks graph(s) {', '.join(sorted(missing))}; export the model again")
        model.set_weights([DeviceDecoder(self.graphs, self.params, []).checkpoint()])
        model.to_neuron()
        return model

    def __call__(self, spec: GraphSpec, *inputs: torch.Tensor) -> torch.Tensor:
        if self.model is None:
            if not neuron_devices_present():
                raise RuntimeError(
                    "no Neuron device (/dev/neuron*) on this host: run the neuron backend on an inf2/trn1/trn2 "
                    "instance, or export with --backend cpu"
                )
            self.model = self._load()
        with torch.inference_mode():
            output = self.model(**dict(zip(INPUT_NAMES, inputs, strict=False)), model_name=spec.key)
        return output[0] if isinstance(output, list | tuple) else output


def _check_tp(neuron_config, error: type[Exception]) -> None:
    if neuron_config.tp_degree != 1:
        raise error(
            f"tp_degree={neuron_config.tp_degree} is not supported by the neuron backend yet: it compiles for one "
            "NeuronCore (sharding the model needs neuronx-distributed parallel layers); use --tensor-parallel-size 1"
        )


def _require(packages: dict[str, str], error: type[Exception], alternative: str) -> None:
    missing = [dist for dist, module in packages.items() if importlib.util.find_spec(module) is None]
    if missing:
        names = ", ".join(missing[:-1]) + " and " + missing[-1] if len(missing) > 1 else missing[0]
        raise error(
            f"the neuron backend needs {names} (not installed): install them from {_sdk(missing)}, {alternative}"
        )


def _nxd(error: type[Exception]):
    """ModelBuilder (V2) and NxDModel with save/load: neuronx-distributed 0.16+ (Neuron SDK 2.27+)."""
    try:
        from neuronx_distributed import ModelBuilder, NxDModel
    except ImportError as failure:
        raise error(f"cannot import neuronx-distributed ({failure}); reinstall it from {_sdk()}") from None
    if not hasattr(NxDModel, "load"):
        raise error(
            f"the neuron backend needs neuronx-distributed 0.16 or later (Neuron SDK 2.27+); upgrade from {_sdk()}"
        )
    return ModelBuilder, NxDModel


def _target(neuron_config) -> str:
    if neuron_config.target:
        return TARGETS[neuron_config.target]
    if not neuron_devices_present():
        raise ExportError(
            "no Neuron device on this host: pass --instance-type (inf2, trn1, trn1n or trn2) to compile for one"
        )
    from torch_neuronx.utils.utils import get_platform_target

    return get_platform_target()


def _sdk(packages=("torch-neuronx", "neuronx-distributed", "neuronx-cc")) -> str:
    return SDK.format(" ".join(packages))


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
