"""Command-line arguments of `optimum-cli export neuron` and their translation into a NeuronConfig.

Only the standard library is imported at module level: optimum-cli imports this module (through the register
module) every time it starts, whatever the command, so torch and transformers are imported only when an export runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")
CPU_COMPILERS = ("export", "inductor")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# TorchNeuron's targets; NeuronConfig explains why inf2/trn1 are refused.
INSTANCE_TYPES = ("trn2", "trn3")
BACKENDS = ("auto", "neuron", "cpu")
# Sequence lengths above the chunk size get chunked prefill by default, with chunks of this many tokens (below it, one
# context_encoding graph of the whole sequence). On the CPU backend a prompt's prefill costs per token 1.45x one pass
# over it in 128-token chunks, 1.19x in 256 and 1.18x in 512 (2 threads,
# benchmark/results/20261128-prefill-widths-2-threads): 256 rows fill the cores' products, and a longer chunk only
# stalls the decodes of its step longer. On Neuron, fewer and larger graphs: 1024.
AUTO_CHUNK_SIZES = {"neuron": 1024, "cpu": 256}
DEFAULT_MAX_TOPK = 256
DEFAULT_MAX_LOGIT_BIAS = 32  # NeuronConfig.max_logit_bias

EPILOG = """\
examples:
  optimum-cli export neuron --model HuggingFaceTB/SmolLM2-135M-Instruct \\
      --batch-size 4 --sequence-length 4096 --prefill-chunk-size 512 smollm2-neuron/
  optimum-cli export neuron --model ./model.gguf --batch-size 1 --sequence-length 512 --backend cpu out/

Every option also accepts optimum's underscore spelling (--batch_size, --sequence_length, ...).
The output directory is written beside OUTPUT and renamed into place at the end: a failed export leaves nothing.
"""


def _modules(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _spellings(name: str) -> list[str]:
    """`--batch-size` and optimum's `--batch_size`."""
    dashed = "--" + name
    underscored = "--" + name.replace("-", "_")
    return [dashed] if dashed == underscored else [dashed, underscored]


def _dtype(value: str) -> str:
    value = DTYPE_ALIASES.get(value.lower(), value.lower())
    if value.startswith("torch."):
        value = value[len("torch.") :]
    if value not in DTYPES:
        raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(DTYPES)}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Compile a decoder-only language model for AWS Neuron (or for the CPU reference backend) into a\n"
        "directory that `vllm serve` and NeuronModelForCausalLM.from_pretrained load."
    )
    parser.epilog = EPILOG
    required = parser.add_argument_group("required arguments")
    required.add_argument(
        "-m",
        *_spellings("model"),
        dest="model",
        metavar="MODEL",
        required=True,
        help="a local Hugging Face model directory, a .gguf file, or a Hugging Face Hub model id "
        "(downloaded only when the network is reachable)",
    )
    required.add_argument(
        *_spellings("batch-size"),
        dest="batch_size",
        metavar="B",
        type=int,
        required=True,
        help="number of sequences served concurrently (KV cache slots)",
    )
    required.add_argument(
        *_spellings("sequence-length"),
        dest="sequence_length",
        metavar="S",
        type=int,
        required=True,
        help="maximum tokens per sequence, prompt plus generated (at most the model's max_position_embeddings)",
    )
    required.add_argument("output", metavar="OUTPUT", type=Path, help="directory to write the compiled model to")

    optional = parser.add_argument_group("compilation options")
    optional.add_argument(
        *_spellings("prefill-chunk-size"),
        dest="prefill_chunk_size",
        metavar="C",
        type=int,
        default=None,
        help="tokens per prefill graph call; 0 disables chunking (one sequence-length context_encoding graph). "
        f"Default: {AUTO_CHUNK_SIZES['neuron']} on the neuron backend, {AUTO_CHUNK_SIZES['cpu']} on the cpu backend, "
        "when the sequence length exceeds it, else 0",
    )
    optional.add_argument(
        *_spellings("prefill-batch-size"),
        dest="prefill_batch_size",
        metavar="P",
        type=int,
        default=1,
        help="chunked prefill only: also compile chunked_prefill for 2..P prompts at once (one graph per count and "
        "context bucket), so that prompts arriving together are prefilled in one call per chunk (at most the batch "
        "size). Default: 1",
    )
    optional.add_argument(
        *_spellings("prefill-tail-size"),
        dest="prefill_tail_size",
        metavar="T",
        type=int,
        default=0,
        help="chunked prefill only: also compile chunked_prefill (one prompt) and chunk_and_decode with a T-token "
        "chunk per bucket (T below the chunk size): a prompt's last piece of at most T tokens, such as the question "
        "after a prefix-cache hit, runs on it instead of a whole chunk. Default: 0 (none)",
    )
    optional.add_argument(
        *_spellings("decode-batch-sizes"),
        dest="decode_batch_sizes",
        metavar="N1,N2,...",
        type=_row_counts,
        default=None,
        help="row counts to compile token_generation for, increasing, ending with the batch size; a decode step of n "
        "requests runs the graph of the smallest count holding them. Default: 1,B (a lone request attends and "
        "samples one row, not B)",
    )
    optional.add_argument(
        *_spellings("block-size"),
        dest="block_size",
        metavar="N",
        type=int,
        default=None,
        help="positions per KV cache block: a divisor of the sequence length, the chunk and every bucket, or the "
        "sequence length (one block per sequence). `vllm serve` uses the same. Default: the largest power of two up "
        "to 128 that divides them",
    )
    optional.add_argument(
        *_spellings("num-blocks"),
        dest="num_blocks",
        metavar="N",
        type=int,
        default=None,
        help="blocks of the KV cache pool the graphs are compiled for, the null block included: the memory the "
        "batch's sequences share (a request holds only the blocks its tokens fill). Default: B full-length "
        "sequences, B * S / block size + 1",
    )
    optional.add_argument(
        *_spellings("tensor-parallel-size"),
        dest="tensor_parallel_size",
        metavar="T",
        type=int,
        default=1,
        help="number of NeuronCores the model is split over (default: 1)",
    )
    optional.add_argument(
        *_spellings("torch-dtype"),
        dest="torch_dtype",
        metavar="{" + ",".join(DTYPES) + "}",
        type=_dtype,
        default=None,
        help="weight and activation dtype (default: bfloat16 for the neuron backend, float32 for cpu)",
    )
    optional.add_argument(
        *_spellings("quantize"),
        dest="quantize",
        choices=("fp8",),
        default=None,
        help="fp8: store the attention and MLP projections' weights in FP8 (E4M3) with per-output-channel scales, "
        "in the target's range (docs/fp8.md). An FP8 checkpoint (fp8, compressed-tensors or ModelOpt) stays FP8 "
        "without it. Default: the weights in --torch-dtype",
    )
    optional.add_argument(
        *_spellings("kv-cache-dtype"),
        dest="kv_cache_dtype",
        choices=("auto", "fp8"),
        default="auto",
        help="fp8: the KV cache holds FP8 (E4M3) values with a K and a V scale per layer, from the checkpoint or "
        "calibrated at export; attention runs in --torch-dtype. Default: auto (the model dtype)",
    )
    optional.add_argument(
        *_spellings("on-device-sampling"),
        dest="on_device_sampling",
        action="store_true",
        default=True,
        help="sample tokens inside the token_generation graph (default)",
    )
    optional.add_argument(
        *_spellings("no-on-device-sampling"),
        dest="on_device_sampling",
        action="store_false",
        help="return logits from the graph and sample on the host",
    )
    optional.add_argument(
        *_spellings("max-topk"),
        dest="max_topk",
        metavar="K",
        type=int,
        default=DEFAULT_MAX_TOPK,
        help=f"largest top_k the on-device sampler supports (default: {DEFAULT_MAX_TOPK})",
    )
    optional.add_argument(
        *_spellings("max-logprobs"),
        dest="max_logprobs",
        metavar="N",
        type=int,
        default=None,
        help="top logprobs the on-device sampler returns per token, at most max_topk; 0: none, requests asking for "
        "logprobs are refused (default: 20, or max_topk if smaller)",
    )
    optional.add_argument(
        *_spellings("max-logit-bias"),
        dest="max_logit_bias",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_LOGIT_BIAS,
        help="logit_bias entries per request the on-device sampler takes; requests with more are refused; 0: none "
        f"(default: {DEFAULT_MAX_LOGIT_BIAS})",
    )
    optional.add_argument(
        *_spellings("speculative-tokens"),
        dest="speculative_tokens",
        metavar="K",
        type=int,
        default=0,
        help="also compile verify graphs of K draft tokens per request, for `vllm serve --speculative-config` "
        "(n-gram) with num_speculative_tokens K (default: 0, none)",
    )
    optional.add_argument(
        *_spellings("max-loras"),
        dest="max_loras",
        metavar="N",
        type=int,
        default=0,
        help="LoRA adapters the graphs hold at once (slots besides the base model), for `vllm serve --enable-lora` "
        "and NeuronModelForCausalLM.load_adapter; with --max-lora-rank (default: 0, no LoRA inputs)",
    )
    optional.add_argument(
        *_spellings("max-lora-rank"),
        dest="max_lora_rank",
        metavar="R",
        type=int,
        default=0,
        help="the largest LoRA rank a slot holds; smaller ranks are zero-padded (default: 0, no LoRA inputs)",
    )
    optional.add_argument(
        *_spellings("lora-target-modules"),
        dest="lora_target_modules",
        metavar="MODULES",
        type=_modules,
        default=None,
        help="comma-separated projections LoRA slots are held for (default: q_proj,k_proj,v_proj,o_proj,gate_proj,"
        "up_proj,down_proj)",
    )
    optional.add_argument(
        *_spellings("prompt-logprobs"),
        dest="prompt_logprobs",
        action="store_true",
        help="chunked only: also compile prompt_logits (every position's logits of a chunk, one graph per prefill "
        "bucket) so requests may ask for prompt_logprobs (completions echo with logprobs)",
    )
    optional.add_argument(
        *_spellings("prefix-copy"),
        dest="prefix_copy",
        action="store_true",
        help="chunked only: also compile copy_prefix per context bucket, for the Python API's "
        "NeuronModelForCausalLM.copy_prefix (`vllm serve` shares cached KV blocks instead and never runs it)",
    )
    optional.add_argument(
        *_spellings("instance-type"),
        dest="instance_type",
        metavar="{" + ",".join(INSTANCE_TYPES) + "}",
        default=None,
        help="the instance the neuron backend compiles for: it sets the FP8 weights' range, trn2's FP8 compiler option "
        "and the memory plan (checked against this host; default: this host's, and --quantize fp8 or --kv-cache-dtype "
        "fp8 on a host that is not a Neuron instance need it)",
    )
    optional.add_argument(
        *_spellings("backend"),
        dest="backend",
        choices=BACKENDS,
        default="auto",
        help="neuron: compile NEFFs with TorchNeuron (trn2/trn3 host); cpu: the reference backend (torch.export), runs on any "
        "host; auto (default): neuron when /dev/neuron* devices exist, else cpu",
    )
    optional.add_argument(
        *_spellings("context-buckets"),
        dest="context_buckets",
        metavar="L1,L2,...",
        type=_buckets,
        default=None,
        help="cache lengths to compile chunk_and_decode, verify, copy_prefix, context_encoding and (unless "
        "--decode-buckets) token_generation for, increasing, "
        "ending with the sequence length; a call runs the graph of the smallest bucket holding its context. Default: "
        "doubling lengths from the chunk size up to the sequence length, at most 4",
    )
    optional.add_argument(
        *_spellings("decode-buckets"),
        dest="decode_buckets",
        metavar="L1,L2,...",
        type=_buckets,
        default=None,
        help="cache lengths to compile token_generation for, increasing, ending with the sequence length; a decode "
        "step runs the graph of the smallest bucket holding its longest row and reads every row's cache up to it. "
        "Decode graphs compile fastest: finer lengths than --context-buckets (e.g. every 128) cut what each step "
        "reads. Default: the context buckets",
    )
    optional.add_argument(
        *_spellings("prefill-buckets"),
        dest="prefill_buckets",
        metavar="0,P1,...",
        type=_prefill_buckets,
        default=None,
        help="chunked exports: prior-context lengths to compile chunked_prefill for, increasing from 0, ending with "
        "the sequence length; a chunk starting at position s attends the smallest bucket >= s and its own block. "
        "Default: 0, then multiples of the chunk size in half-octave steps (1, 2, 3, 4, 6, 8, 12, ... chunks), at "
        "most 10 besides 0",
    )
    optional.add_argument(
        *_spellings("cpu-compiler"),
        dest="cpu_compiler",
        choices=CPU_COMPILERS,
        default="export",
        help="cpu backend only: export (default) keeps torch.export programs (replayed in C++ after their first "
        "call); inductor compiles each graph to C++ with AOTInductor (minutes per graph for a real model)",
    )
    optional.add_argument(
        *_spellings("dry-run"),
        dest="dry_run",
        action="store_true",
        help="print the graphs the export would compile and the memory plan per rank, then exit without compiling "
        "(reads only the model's config.json: no weights, no Neuron SDK; OUTPUT is not written)",
    )
    optional.add_argument(
        *_spellings("average-length"),
        dest="average_length",
        metavar="L",
        type=int,
        default=None,
        help="tokens of an average request (prompt plus output), to count the requests the KV pool holds in the "
        "memory plan (default: half the sequence length)",
    )
    optional.add_argument(
        *_spellings("compile-workers"),
        dest="compile_workers",
        metavar="N",
        type=int,
        default=None,
        help="graphs compiled at once, in N processes; a graph compiled by an interrupted export of the same "
        "model and options is reused (resume). Default: what the host's cores and memory allow",
    )
    optional.add_argument(
        *_spellings("overwrite"),
        dest="overwrite",
        action="store_true",
        help="replace OUTPUT if it exists and is not empty (otherwise refused)",
    )


def _int_list(example: str, what: str) -> Callable[[str], tuple[int, ...]]:
    def parse(value: str) -> tuple[int, ...]:
        try:
            return tuple(int(part) for part in value.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a comma-separated list of {what}, e.g. {example}"
            ) from None

    return parse


_buckets = _int_list("512,1024,2048", "lengths")
_prefill_buckets = _int_list("0,512,1024,2048", "lengths")
_row_counts = _int_list("1,4", "row counts")


def resolve_chunk_size(prefill_chunk_size: int | None, sequence_length: int, backend: str) -> int:
    if prefill_chunk_size is not None:
        return prefill_chunk_size
    chunk = AUTO_CHUNK_SIZES[backend]
    return chunk if sequence_length > chunk else 0


def resolve_dtype(torch_dtype: str | None, backend: str) -> str:
    if torch_dtype is not None:
        return torch_dtype
    return "bfloat16" if backend == "neuron" else "float32"


@dataclass(frozen=True)
class ExportRequest:
    """What the user asked for, resolved: the model source, the NeuronConfig, where to write it."""

    model: str
    neuron_config: object  # optimum_neuron_plugin.config.NeuronConfig
    output: Path
    overwrite: bool
    dry_run: bool = False
    compile_workers: int | None = None  # None: exporter.workers.default_workers()
    average_length: int | None = None  # the memory plan's average request; None: half of sequence_length


def request_from_args(args: argparse.Namespace) -> ExportRequest:
    """Resolves the automatic values and builds the NeuronConfig (raises NeuronConfigError on bad values, ExportError
    for FP8 graphs on the neuron backend when neither --instance-type nor this host gives the instance type)."""
    from optimum_neuron_plugin.config import NeuronConfig
    from optimum_neuron_plugin.devices import resolve_backend, resolve_target

    backend = resolve_backend(args.backend)
    config = NeuronConfig(
        batch_size=args.batch_size,
        sequence_length=args.sequence_length,
        prefill_chunk_size=resolve_chunk_size(args.prefill_chunk_size, args.sequence_length, backend),
        tp_degree=args.tensor_parallel_size,
        torch_dtype=resolve_dtype(args.torch_dtype, backend),
        on_device_sampling=args.on_device_sampling,
        max_topk=args.max_topk,
        max_logprobs=args.max_logprobs,
        max_logit_bias=args.max_logit_bias,
        prompt_logprobs=args.prompt_logprobs,
        prefix_copy=args.prefix_copy,
        target=args.instance_type,
        backend=backend,
        context_buckets=args.context_buckets,
        decode_buckets=args.decode_buckets,
        prefill_buckets=args.prefill_buckets,
        cpu_compiler=args.cpu_compiler,
        prefill_batch_size=args.prefill_batch_size,
        prefill_tail_size=args.prefill_tail_size,
        decode_batch_sizes=args.decode_batch_sizes,
        speculative_tokens=args.speculative_tokens,
        quantization=args.quantize,
        kv_cache_dtype=None if args.kv_cache_dtype == "auto" else args.kv_cache_dtype,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        lora_target_modules=args.lora_target_modules,
    )
    config = resolve_target(config)  # the neuron backend's instance type: --instance-type, else this host's
    workers = getattr(args, "compile_workers", None)
    if workers is not None and workers < 1:
        raise ValueError(f"--compile-workers {workers} is not allowed: must be an integer >= 1")
    average = getattr(args, "average_length", None)
    if average is not None and not 1 <= average <= config.sequence_length:
        raise ValueError(
            f"--average-length {average} is not allowed: must be in [1, sequence_length={config.sequence_length}]"
        )
    return ExportRequest(
        model=args.model, neuron_config=config, output=args.output, overwrite=args.overwrite,
        dry_run=getattr(args, "dry_run", False), compile_workers=workers, average_length=average,
    )  # fmt: skip


def build_parser(prog: str = "optimum-cli export neuron") -> argparse.ArgumentParser:
    """A standalone parser with the same arguments (for `python -m exporter` and tests)."""
    parser = argparse.ArgumentParser(prog=prog)
    add_arguments(parser)
    return parser
