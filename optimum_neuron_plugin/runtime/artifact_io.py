"""Export, save and load: a checkpoint becomes compiled graphs plus weights in an artifact directory, and back."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from .. import artifact, backends
from ..backends import BackendFactory
from ..backends.compile_pool import SERIAL, CompileOptions
from ..backends.neuron_ranks import compile_on_ranks
from ..config import NeuronConfig
from ..devices import resolve_target
from ..errors import ArtifactError, ExportError
from ..graphs import DecoderGraph, graph_specs
from ..models import fp8, lora, sharding
from ..models.args import ModelArgs
from ..models.collectives import Collectives, export_world
from ..models.decoder import weight_names
from ..models.kv_cache import empty_cache
from . import fp8_params
from .ranks import tp_group

Model = TypeVar("Model")  # NeuronModelForCausalLM, built by the caller's class


def export(
    cls: type[Model],
    model: str | Path,
    neuron_config: NeuronConfig,
    progress: Callable[[str], None] | None = None,
    make_backend: BackendFactory = backends.get_backend,
    options: CompileOptions = SERIAL,
) -> Model:
    """Compiles every graph of `model` (a HF directory, a .gguf file or a hub id) into a temporary directory; the
    returned model runs them until save_pretrained copies them into an artifact. `options`: compile workers and
    the directory of an interrupted export's graphs (backends/compile_pool.py)."""
    progress = progress or (lambda message: None)
    from ..sources import gguf_read_once, load_source, read_config

    neuron_config = resolve_target(neuron_config)
    with gguf_read_once():
        _, args = read_config(model)
        check_model(neuron_config, args)
        layout = sharding.layout_for(args, neuron_config.tp_degree)
        backend = make_backend(neuron_config)
        backend.check_can_compile()
        progress(f"loading weights of {model}")
        source = load_source(model)
    if neuron_config.quantization is None and any(map(fp8.is_fp8, source.state_dict.values())):
        neuron_config = replace(neuron_config, quantization="fp8")  # an FP8 checkpoint stays FP8
        neuron_config = resolve_target(neuron_config)
        check_model(neuron_config, args)  # FP8 graphs: trn2's compiler option
    params = to_params(source.state_dict, args, artifact.torch_dtype(neuron_config), neuron_config)
    if neuron_config.kv_cache_dtype == "fp8":
        progress(
            "K/V cache scales" + ("" if "model.layers.0.self_attn.k_scale" in source.state_dict else ": calibrating")
        )
        params |= fp8_params.kv_scales(source.state_dict, args, params, source.tokenizer)
    params |= lora_slots(args, neuron_config)
    # The weights are stored as the graphs take them (a source's quantization_config no longer applies).
    hf_config = {k: v for k, v in source.hf_config.items() if k != "quantization_config"}
    hf_config["architectures"] = [args.architecture]
    workdir = Path(tempfile.mkdtemp(prefix="onp-graphs-"))
    try:
        compile_graphs(backend, args, layout, neuron_config, params, workdir, progress, options)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    model_ = cls(
        args, neuron_config, hf_config, params, workdir, source.tokenizer, source.generation_config,
        make_backend=make_backend, load_graphs_on_first_call=True,
    )  # fmt: skip
    # The compiled graphs live in workdir until save_pretrained copies them; removed with the model.
    weakref.finalize(model_, shutil.rmtree, workdir, True)
    return model_


def load(
    cls: type[Model],
    directory: str | Path,
    group: dist.ProcessGroup | None = None,
    make_backend: BackendFactory = backends.get_backend,
) -> Model:
    directory = Path(directory)
    if not directory.is_dir():
        raise ArtifactError(f"{directory}: not a directory; give the output directory of `optimum-cli export neuron`")
    neuron_config = artifact.load_neuron_config(directory)
    hf_config, args = artifact.load_config(directory)
    if neuron_config.tp_degree > 1 and group is None and tp_group(neuron_config.tp_degree) is None:
        raise ArtifactError(
            f"{directory}: tp_degree={neuron_config.tp_degree}: load it in each of {neuron_config.tp_degree} "
            f"processes after torch.distributed.init_process_group(world_size={neuron_config.tp_degree})"
        )
    for path in make_backend(neuron_config).graph_files(directory, graph_specs(neuron_config, args.vocab_size)):
        if not path.is_file():
            raise ArtifactError(f"{path}: missing compiled graph; export the model again")
    names = fp8_params.param_names(weight_names(args), args, neuron_config.quantization, neuron_config.kv_cache_dtype)
    params = artifact.load_weights(directory, names) | lora_slots(args, neuron_config)
    tokenizer, generation_config = load_tokenizer(directory)
    try:
        return cls(args, neuron_config, hf_config, params, directory, tokenizer, generation_config, group, make_backend)
    except (RuntimeError, OSError, ValueError) as error:
        if isinstance(error, ArtifactError):
            raise
        raise ArtifactError(f"{directory / 'graphs'}: cannot load a compiled graph ({error}); export again") from None


def lora_slots(args: ModelArgs, neuron_config: NeuronConfig) -> dict[str, torch.Tensor]:
    """The zero LoRA slots of an export with max_loras (models/lora.py), after the weights: never stored."""
    nc = neuron_config
    if not nc.lora:
        return {}
    dtype = artifact.torch_dtype(nc)
    return lora.empty_params(args, nc.max_loras + 1, nc.max_lora_rank, nc.lora_target_modules, dtype)


def compile_graphs(backend, args, layout, neuron_config, params, workdir, progress, options=SERIAL) -> None:
    """Compiles every graph. Under TP on the CPU backend the graphs are traced once on rank 0's shard shapes (every
    rank's are the same) against a fake process group: one rank-independent program per graph and bucket. TorchNeuron
    compiles them for a live group instead: one process per NeuronCore, each on its shard (backends/neuron_ranks.py)."""
    nc = neuron_config
    if nc.tp_degree > 1 and backend.compiles_on_live_ranks:
        if options.workers > 1 or options.resume_dir:
            progress(f"tensor parallel {nc.tp_degree}: every graph compiles on the {nc.tp_degree} ranks in turn (no "
                     "compile workers, no resume)")  # fmt: skip
        compile_on_ranks(backend, args, params, artifact.cache_dtype(nc), workdir, progress)
        return
    shard = sharding.shard_params(params, args, layout, 0)
    caches = empty_cache(
        args.num_hidden_layers, nc.num_blocks, nc.block_size, layout.kv_heads, args.head_dim,
        artifact.cache_dtype(nc),
    )  # fmt: skip
    local = sharding.local_args(args, layout)
    if nc.tp_degree == 1:
        graphs = [DecoderGraph(local, spec, nc.max_topk) for spec in graph_specs(nc, args.vocab_size)]
        backend.compile(graphs, shard, caches, workdir, progress, options=options)
        return
    if dist.is_initialized():
        raise ExportError(
            f"tp_degree={nc.tp_degree}: export in a process where torch.distributed is not initialised (the graphs "
            "are traced on a fake process group and run later in any group of that size)"
        )
    with export_world(nc.tp_degree) as group:
        cc = Collectives(nc.tp_degree, group)
        graphs = [DecoderGraph(local, spec, nc.max_topk, cc) for spec in graph_specs(nc, args.vocab_size)]
        backend.compile(graphs, shard, caches, workdir, progress, options=options)


# neuronx-cc refuses float8_e4m3fn operands on trn1/trn2 (NCC_EVRF051) unless told to read them as trn2's E4M3, an
# option of its HLO-to-tensorizer stage. TorchNeuron splits NEURON_CC_FLAGS on whitespace and runs neuronx-cc without a
# shell (csrc/core/compilation/NeuronCompiler.cpp): the option and its value are one token, with no quotes.
FP8_ON_TRN2_FLAG = "--experimental-unsafe-fp8e4m3fn-as-fp8e4m3"
FP8_ON_TRN2_OPTION = f"--internal-hlo2tensorizer-options={FP8_ON_TRN2_FLAG}"


def fp8_flag_problem(flags: str | None) -> str | None:
    """What NEURON_CC_FLAGS (None: unset) lacks for FP8 graphs on trn2, with the value to set; None: nothing."""
    tokens = (flags or "").split()
    if FP8_ON_TRN2_OPTION in tokens:
        return None
    kept = [token for token in tokens if FP8_ON_TRN2_FLAG not in token]
    fix = f"set NEURON_CC_FLAGS={shlex.quote(' '.join([*kept, FP8_ON_TRN2_OPTION]))} for the export and for vllm serve"
    if len(kept) < len(tokens):
        return (
            f"NEURON_CC_FLAGS={flags!r} does not pass {FP8_ON_TRN2_FLAG} as neuronx-cc reads it: TorchNeuron splits "
            f"the value on whitespace and runs neuronx-cc without a shell, so quotes and spaces reach it as they are; "
            f"{fix}"
        )
    return f"FP8 graphs on trn2 need neuronx-cc's {FP8_ON_TRN2_FLAG} (error NCC_EVRF051 otherwise): {fix}"


def check_model(neuron_config: NeuronConfig, args: ModelArgs) -> None:
    neuron_config.check_model(args.max_position_embeddings)
    fp8_graphs = neuron_config.quantization or neuron_config.kv_cache_dtype
    if neuron_config.backend == "neuron" and neuron_config.target == "trn2" and fp8_graphs:
        problem = fp8_flag_problem(os.environ.get("NEURON_CC_FLAGS"))
        if problem:
            raise ExportError(problem)
    # A model whose every layer slides forgets what lies beyond its window: refused past it. Models that mix
    # sliding and full layers (Gemma 3) serve any length, their sliding layers masked to the window.
    if args.every_layer_slides and args.sliding_window < neuron_config.sequence_length:
        raise ExportError(
            f"sequence_length={neuron_config.sequence_length} exceeds the model's sliding window ({args.sliding_window}); "
            "use a sequence length at most the sliding window"
        )


def to_params(
    state_dict: dict[str, torch.Tensor], args: ModelArgs, dtype: torch.dtype, neuron_config: NeuronConfig | None = None
) -> dict[str, torch.Tensor]:
    """The weights the graphs take: in `dtype`, or with FP8 projections when neuron_config.quantization is "fp8"
    (runtime/fp8_params.py); an FP8 checkpoint tensor outside them is dequantized."""
    names = weight_names(args)
    missing = [n for n in names if n not in state_dict]
    if missing:
        raise ExportError(f"the checkpoint lacks weight(s) {', '.join(missing[:3])}")
    if neuron_config is not None and neuron_config.quantization == "fp8":
        return fp8_params.fp8_weights(state_dict, names, dtype, neuron_config.target)
    return {n: _dequantized(state_dict, n).to(dtype).contiguous() for n in names}


def _dequantized(state_dict: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    scale = state_dict.get(name + fp8.SCALE_SUFFIX)
    return state_dict[name] if scale is None else fp8.dequantize(state_dict[name], scale)


def load_tokenizer(directory: Path) -> tuple[object | None, object | None]:
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = generation_config = None
    if (directory / "tokenizer_config.json").is_file():
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(directory))
        except (OSError, ValueError) as error:
            raise ArtifactError(f"{directory}: tokenizer files are unreadable ({error}); export again") from None
    if (directory / "generation_config.json").is_file():
        generation_config = GenerationConfig.from_pretrained(str(directory))
    return tokenizer, generation_config
