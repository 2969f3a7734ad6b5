"""The export itself: validate everything cheap first, compile, write beside OUTPUT, rename into place.

Failure policy: every bad input raises a ValueError/OSError subclass with a one-line message before anything is
written; the compiled model is written into a hidden temporary directory beside OUTPUT which is renamed to OUTPUT
only once complete, and removed on any failure (including Ctrl-C). OUTPUT itself is never modified before that
final rename, so an existing directory survives a failed `--overwrite` export untouched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from exporter.cli import ExportRequest
from exporter.plan import plan_export

# Weights, configs and tokenizer files; other formats (.bin, .onnx, .gguf, ...) of a hub repository are not needed.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


class ExportInputError(ValueError):
    """A bad input detected by the exporter itself (paths, output directory, hub access)."""


def one_line(message: object) -> str:
    """Error messages are printed on a single line (some libraries' messages are paragraphs)."""
    text = " ".join(str(message).split())
    return text or type(message).__name__


# --------------------------------------------------------------------------------------------------------------
# model source
# --------------------------------------------------------------------------------------------------------------


def _looks_like_path(model: str) -> bool:
    """A hub id is `name` or `owner/name`; anything else that does not exist locally is a missing path."""
    return (
        model.startswith(("/", ".", "~"))
        or model.lower().endswith((".gguf", ".json", ".safetensors"))
        or model.count("/") > 1
        or os.sep != "/"
        and os.sep in model
    )


def resolve_model_source(
    model: str, progress: Callable[[str], None] = print, patterns: list[str] | None = None
) -> Path:
    """A local model directory or .gguf file; a hub id is downloaded (or found in the cache) first: the files
    matching `patterns` (default HUB_PATTERNS)."""
    path = Path(model).expanduser()
    if path.exists():
        if path.is_dir():
            if not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
                raise ExportInputError(
                    f"model directory {model} has no config.json: not a Hugging Face model directory"
                )
        elif path.suffix.lower() != ".gguf":
            raise ExportInputError(f"model {model} is a file but not a .gguf file; pass a model directory or a .gguf")
        if not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
            raise ExportInputError(f"model {model} is not readable (permission denied)")
        return path.absolute()
    if not model or _looks_like_path(model):
        raise ExportInputError(f"model {model!r} not found: no such file or directory")
    return _download(model, progress, patterns or HUB_PATTERNS)


def _download(repo_id: str, progress: Callable[[str], None], patterns: list[str]) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    progress(f"resolving {repo_id} on the Hugging Face Hub")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except HFValidationError:
        raise ExportInputError(
            f"model {repo_id!r} is neither an existing local path nor a valid Hugging Face Hub model id"
        ) from None
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub is unreachable (offline?)"
        raise ExportInputError(
            f"model {repo_id!r} is not a local path and cannot be downloaded: {why} and it is not in the "
            f"local cache; pass a local model directory or .gguf file, or retry with network access"
        ) from None
    except GatedRepoError:
        raise ExportInputError(
            f"model {repo_id!r} is gated on the Hugging Face Hub: accept its license and log in (`hf auth login`)"
        ) from None
    except RepositoryNotFoundError:
        raise ExportInputError(
            f"model {repo_id!r} is not a local path and no such repository exists on the Hugging Face Hub "
            f"(or it is private: log in with `hf auth login`)"
        ) from None
    except RevisionNotFoundError as error:
        raise ExportInputError(f"model {repo_id!r}: {one_line(error)}") from None


# --------------------------------------------------------------------------------------------------------------
# output directory
# --------------------------------------------------------------------------------------------------------------


def check_output(output: Path, overwrite: bool, model_path: Path | None = None) -> Path:
    """Refuses an unusable OUTPUT before any work is done; returns its absolute path."""
    target = Path(os.path.realpath(output.expanduser()))
    if target.exists():
        if not target.is_dir():
            raise ExportInputError(f"output {output} exists and is not a directory")
        if any(target.iterdir()) and not overwrite:
            raise ExportInputError(f"output directory {output} exists and is not empty; pass --overwrite to replace it")
    if model_path is not None:
        # Replacing OUTPUT must never delete the model being read: refuse OUTPUT == model or one of its ancestors.
        source = Path(os.path.realpath(model_path))
        if target == source or target in source.parents:
            raise ExportInputError(
                f"output {output} overlaps the model source {model_path}; choose another output directory"
            )
    parent = _existing_ancestor(target.parent)
    if not parent.is_dir():
        raise ExportInputError(f"cannot create output {output}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportInputError(f"cannot write output {output}: permission denied in {parent}")
    return target


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


@contextlib.contextmanager
def staging_directory(target: Path) -> Iterator[Path]:
    """A hidden directory beside `target` that is removed unless published (renamed to `target`)."""
    created: list[Path] = []
    parent = target.parent
    while not parent.exists():
        created.append(parent)
        parent = parent.parent
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for directory in created:  # innermost first; only the ones this export created
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise


def publish(staging: Path, target: Path, overwrite: bool) -> None:
    """Renames the complete staging directory to `target` (replacing it when `overwrite`)."""
    staging.chmod(0o755)  # mkdtemp creates 0o700
    if target.exists() and any(target.iterdir()):
        if not overwrite:  # appeared during the export
            raise ExportInputError(f"output directory {target} exists and is not empty; pass --overwrite to replace it")
        backup = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, backup / target.name)
        try:
            os.replace(staging, target)
        except BaseException:
            os.replace(backup / target.name, target)
            raise
        shutil.rmtree(backup, ignore_errors=True)
    else:
        # rename(2) replaces an empty directory atomically.
        os.replace(staging, target)


# --------------------------------------------------------------------------------------------------------------
# versions recorded in neuron_config.json
# --------------------------------------------------------------------------------------------------------------


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def version_fields(backend: str) -> dict[str, object]:
    """Versions recorded beside the configuration: this package, the compiler that produced the graphs (the
    runtime's save_pretrained writes both; these are fallbacks) and transformers, which read the checkpoint.
    No timestamps or paths: exporting the same model twice gives a byte-identical neuron_config.json."""
    if backend == "neuron":
        compiler = {"name": "neuronx-cc", "version": _version("neuronx-cc")}
    else:
        import torch

        compiler = {"name": "torch.export", "version": torch.__version__}
    return {
        "optimum_neuron_plugin_version": _version("optimum-neuron-plugin"),
        "compiler": compiler,
        "transformers_version": _version("transformers"),
    }


def record_versions(directory: Path, backend: str) -> None:
    """Adds the version fields to the runtime's neuron_config.json where it has not written them itself."""
    import json

    from optimum_neuron_plugin.config import NEURON_CONFIG_FILE

    path = directory / NEURON_CONFIG_FILE
    data = json.loads(path.read_text())
    missing = {k: v for k, v in version_fields(backend).items() if k not in data}
    if missing:
        data.update(missing)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------------------------


def _progress(message: str) -> None:
    print(f"[export] {message}", flush=True)


def describe_config(config) -> str:
    prefill = (
        f"chunked_prefill ({config.prefill_chunk_size} tokens/call)"
        if config.chunked
        else f"context_encoding ({config.sequence_length} tokens)"
    )
    sampling = (
        f"on device (max_topk {config.max_topk}, max_logprobs {config.max_logprobs}, "
        f"max_logit_bias {config.max_logit_bias})"
        if config.on_device_sampling
        else "on host"
    )
    target = f", target {config.target}" if config.target else ""
    return (
        f"backend {config.backend}{target}, {config.torch_dtype}, batch size {config.batch_size}, "
        f"sequence length {config.sequence_length}, prefill {prefill}, tensor parallel {config.tp_degree}, "
        f"sampling {sampling}"
        + (f", verify graphs of {config.speculative_tokens} drafts" if config.speculative_tokens else "")
        + (
            f", {config.max_loras} LoRA slots of rank {config.max_lora_rank} ({','.join(config.lora_target_modules)})"
            if config.lora
            else ""
        )
    )


def export(request: ExportRequest, progress: Callable[[str], None] = _progress) -> Path:
    """Runs one export; returns the published directory. Raises ValueError/OSError on bad input."""
    config = request.neuron_config
    # Cheap checks first: nothing is loaded or written while any of these can still fail.
    check_output(request.output, request.overwrite)
    source = resolve_model_source(request.model, progress)
    target = check_output(request.output, request.overwrite, source)

    progress(describe_config(config))
    from optimum_neuron_plugin.runtime import NeuronModelForCausalLM
    from optimum_neuron_plugin.sources import gguf_read_once

    with gguf_read_once():  # the plan and the export parse a GGUF's metadata once between them
        plan_export(source, config, progress, request.average_length)  # refuses a misfit before reading weights
        options = compile_options(request, target)
        start = time.monotonic()
        try:
            model = NeuronModelForCausalLM.export(source, config, progress=progress, options=options)
        except BaseException:
            _keep_for_resume(options.resume_dir, progress)
            raise
    progress(f"compiled {len(model.specs)} graph(s) in {time.monotonic() - start:.1f} s")
    with staging_directory(target) as staging:
        progress(f"writing {request.output}")
        model.save_pretrained(staging)
        record_versions(staging, config.backend)
        publish(staging, target, request.overwrite)
    shutil.rmtree(options.resume_dir, ignore_errors=True)
    return target


def resume_directory(target: Path) -> Path:
    """Where an export keeps each graph as soon as it is compiled, until its output is published: the same command
    run again after an interruption copies them instead of compiling them again."""
    return target.parent / f".{target.name}.compiled"


def compile_options(request: ExportRequest, target: Path):
    """Compile workers (the request's, else what this host's cores and memory allow) and the resume directory."""
    from optimum_neuron_plugin.backends import get_backend
    from optimum_neuron_plugin.backends.compile_pool import CompileOptions, default_workers
    from optimum_neuron_plugin.graphs import graph_specs

    workers = request.compile_workers
    if workers is None:
        backend = get_backend(request.neuron_config)
        graphs = len(graph_specs(request.neuron_config, 0))
        workers = default_workers(backend.worker_bytes, graphs, backend.graphs_per_worker)
        if request.neuron_config.backend == "neuron":  # each worker compiles on a NeuronCore of its own
            from optimum_neuron_plugin.backends.neuron import neuron_core_count

            workers = max(1, min(workers, neuron_core_count()))
    resume = resume_directory(target)
    resume.mkdir(parents=True, exist_ok=True)
    return CompileOptions(workers=workers, resume_dir=resume)


def _keep_for_resume(resume: Path, progress: Callable[[str], None]) -> None:
    if any(resume.iterdir()):
        progress(f"the graphs compiled so far are kept in {resume}: the same command resumes from them")
    else:
        shutil.rmtree(resume, ignore_errors=True)


def run(args) -> int:
    """The `optimum-cli export neuron` entry point: 0 on success, 1 on a bad input (one line on stderr)."""
    from exporter.cli import request_from_args

    start = time.monotonic()
    try:
        request = request_from_args(args)
        _quiet_libraries()
        if request.dry_run:
            dry_run(request)
            return 0
        target = export(request)
    except (ValueError, OSError, ImportError) as error:
        print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written", file=sys.stderr, flush=True)
        return 130
    from exporter.info import describe

    print(f"Exported {request.model} to {request.output} in {time.monotonic() - start:.1f} s")
    for line in describe(target):
        print(f"  {line}")
    return 0


def dry_run(request: ExportRequest) -> None:
    """Prints the graphs the export would compile and the memory plan per rank; reads only config.json."""
    source = resolve_model_source(request.model, _progress, patterns=["config.json"])
    print(describe_config(request.neuron_config), flush=True)
    plan_export(source, request.neuron_config, lambda line: print(line, flush=True), request.average_length)


def _quiet_libraries() -> None:
    """transformers' informational logging would bury the progress lines; errors still surface as exceptions."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
