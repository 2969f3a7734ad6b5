"""NeuronConfig: the static shapes and options a model is compiled for."""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

NEURON_CONFIG_FILE = "neuron_config.json"
# 2: context-length buckets (one graph file per graph and bucket).
# 3: int32 index inputs; graphs write the new K/V first, then attend their bucket (bucket > last position).
# 4: chunk_and_decode graphs (a prompt chunk and a decode batch in one call).
# 5: chunked_prefill graphs per prior bucket (prefill_buckets): a chunk attends the cache before its start and its
#    own block; chunk_and_decode's chunk likewise. On-device sampling graphs take a packed token bitmask
#    (structured outputs).
# 6: on-device sampling graphs return, next to each sampled token, its logprob, rank and the top max_logprobs.
# 7: on-device sampling graphs take min_p (a fourth sampling parameter) and max_logit_bias (token id, bias) pairs per
#    row (logit_bias).
# 8: the KV cache is a pool of blocks (block_size, num_blocks): every graph row takes a block table.
FORMAT_VERSION = 8
# Default block_size: the largest power of two up to this that divides sequence_length, the chunk and every bucket.
DEFAULT_BLOCK_SIZE = 128
# Default max_logprobs: vLLM's own default (--max-logprobs 20), capped at max_topk.
DEFAULT_MAX_LOGPROBS = 20
# Default max_logit_bias: (token id, bias) pairs per row the decode graphs take.
DEFAULT_MAX_LOGIT_BIAS = 32
DTYPES = ("float32", "bfloat16", "float16")
BACKENDS = ("cpu", "neuron")
TARGETS = ("trn2", "trn3")
# Instances TorchNeuron (Neuron SDK 2.33+, torch 2.10+) does not cover: they stay on the XLA stack of SDK 2.31.
LEGACY_TARGETS = ("inf1", "inf2", "trn1", "trn1n")
CPU_COMPILERS = ("export", "inductor")
# Default context buckets: doubling lengths ending at sequence_length, at most this many.
MAX_DEFAULT_BUCKETS = 4
# Default prefill buckets: 0 and multiples of the chunk size in half-octave steps, at most this many nonzero ones.
MAX_DEFAULT_PREFILL_BUCKETS = 10
# The neuron backend's defaults are economical: neuronx-cc takes minutes per graph of an 8B model, so a chunked export
# compiles at most 9 graphs (docs/neuron.md, "Graphs"): 2 context buckets (chunk_and_decode), 3 decode
# buckets (token_generation for batch_size rows only) and the prefill buckets 0 plus 3 doubling chunk multiples.
NEURON_MAX_DEFAULT_BUCKETS = 2
NEURON_MAX_DEFAULT_DECODE_BUCKETS = 3
NEURON_MAX_DEFAULT_PREFILL_BUCKETS = 3
# Fields an artifact may leave out of neuron_config.json (their default applies).
OPTIONAL_FIELDS = (
    "speculative_tokens", "prompt_logprobs", "prefill_tail_size", "prefix_copy", "decode_buckets", "quantization",
    "kv_cache_dtype", "max_loras", "max_lora_rank", "lora_target_modules",
)  # fmt: skip
# LoRA: the projections adapters may target (models/lora.py), and the default targets: all of them.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_FIELDS = ("max_loras", "max_lora_rank", "lora_target_modules")
# FP8 weights (NeuronConfig.quantization) and KV cache (kv_cache_dtype): docs/fp8.md.
QUANTIZATIONS = ("fp8",)
KV_CACHE_DTYPES = ("fp8",)


class NeuronConfigError(ValueError):
    """A configuration value is not allowed; the message says which and what is."""


@dataclass(frozen=True)
class NeuronConfig:
    batch_size: int = 1
    sequence_length: int = 2048
    # 0 means no chunking: one full-length context_encoding graph.
    prefill_chunk_size: int = 0
    tp_degree: int = 1
    torch_dtype: str = "float32"
    on_device_sampling: bool = True
    max_topk: int = 256
    target: str | None = None
    backend: str = "cpu"
    # Cache lengths every graph is compiled for except the prompt chunks' (chunked_prefill, prompt_logits: per
    # prefill_buckets) and, when decode_buckets is set, token_generation: a graph for bucket L reads cache positions
    # [0, L) only. None: default_context_buckets().
    # The last bucket is always sequence_length.
    context_buckets: tuple[int, ...] | None = None
    # Cache lengths token_generation is compiled for; a decode call runs the smallest holding its longest row. A
    # decode step reads every row's cache up to its bucket, and decode graphs are among the smallest to compile, so
    # finer lengths than context_buckets cut what a step reads for one graph each. None: context_buckets.
    decode_buckets: tuple[int, ...] | None = None
    # CPU backend only: "export" keeps each graph's torch.export program (replayed by TorchScript), "inductor"
    # compiles it to C++ with AOTInductor (minutes per graph for a real model).
    cpu_compiler: str = "export"
    # Chunked exports: also compile chunked_prefill for 2..prefill_batch_size prompts at once (chunk k of each
    # prompt in one call, one pass over the weights for all). 1: one prompt per call only.
    prefill_batch_size: int = 1
    # Row counts token_generation is compiled for: a decode call of n requests runs the graph of the smallest
    # count >= n (fewer rows attend and sample less). None: default_decode_batch_sizes(). Ends with batch_size.
    decode_batch_sizes: tuple[int, ...] | None = None
    # Chunked exports: prior lengths chunked_prefill is compiled for. A chunk starting at position s runs the graph
    # of the smallest bucket P >= s: it attends cache positions [0, P) (those >= s masked) and its own block.
    # Starts with 0 (first chunks attend only themselves), ends with sequence_length. None: default_prefill_buckets().
    # Unchunked exports have none (context_encoding runs per context bucket).
    prefill_buckets: tuple[int, ...] | None = None
    # On-device sampling graphs take a packed token bitmask input (structured outputs).
    token_bitmask: bool = True
    # On-device sampling: top logprobs the decode graphs return per row (vLLM's raw logprobs of the top candidates,
    # at most max_topk). 0: the graphs return tokens only. None: min(DEFAULT_MAX_LOGPROBS, max_topk).
    max_logprobs: int | None = None
    # On-device sampling: logit_bias entries per row the decode graphs take ((token id, bias) pairs added to the
    # logits before sampling). 0: no logit_bias input.
    max_logit_bias: int = DEFAULT_MAX_LOGIT_BIAS
    # Speculative decoding: draft tokens k a verify graph checks per row (k + 1 tokens per row); 0: no verify graphs.
    # Optional in neuron_config.json (absent: 0), so exports without verify graphs keep their format.
    speculative_tokens: int = 0
    # Chunked exports: also compile prompt_logits (chunked_prefill returning the logits of every position of its
    # chunk) per prefill bucket, for requests asking for prompt logprobs. Absent from older format-6 files: false.
    prompt_logprobs: bool = False
    # Chunked exports: also compile chunked_prefill (one prompt) and chunk_and_decode with a chunk of this many tokens
    # (0 < T < prefill_chunk_size): a prompt's last piece of at most T tokens runs on it instead of a whole chunk (the
    # question after a prefix-cache hit, a prompt's remainder). 0: none. Absent from older format-7 files: 0.
    prefill_tail_size: int = 0
    # Chunked exports: also compile copy_prefix per context bucket, for the Python API's copy_prefix (a slot's prefix
    # copied into another slot's blocks). Under vLLM requests share cached blocks instead, so it never runs there.
    # None or absent from the file: false.
    prefix_copy: bool | None = None
    # "fp8": the attention and MLP projections' weights are FP8 with fp32 scales (docs/fp8.md); None: every weight
    # in torch_dtype. Absent from older files: None.
    quantization: str | None = None
    # "fp8": the KV cache holds FP8 (E4M3) values with one K and one V scale per layer; None: torch_dtype. Absent
    # from older files: None.
    kv_cache_dtype: str | None = None
    # Positions per KV cache block (models/kv_cache.py): divides sequence_length, the chunk and every bucket, or equals
    # sequence_length (one block per sequence). None: default_block_size().
    block_size: int | None = None
    # Blocks of the KV pool the graphs are compiled for, the null block 0 included. None: batch_size full-length
    # sequences plus the null block.
    num_blocks: int | None = None
    # LoRA slots (docs/lora.md): adapters the graphs hold at once besides the base model (slot 0), their largest
    # rank and the projections they may target. 0: no LoRA inputs, and these fields are left out of
    # neuron_config.json. lora_target_modules None: LORA_TARGETS.
    max_loras: int = 0
    max_lora_rank: int = 0
    lora_target_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "sequence_length", "tp_degree", "max_topk", "prefill_batch_size"):
            _require_positive_int(name, getattr(self, name))
        if not isinstance(self.prefill_chunk_size, int) or self.prefill_chunk_size < 0:
            _fail("prefill_chunk_size", self.prefill_chunk_size, "an integer >= 0 (0 disables chunking)")
        if self.prefill_chunk_size > self.sequence_length:
            _fail(
                "prefill_chunk_size",
                self.prefill_chunk_size,
                f"at most sequence_length ({self.sequence_length})",
            )
        if self.torch_dtype not in DTYPES:
            _fail("torch_dtype", self.torch_dtype, f"one of {', '.join(DTYPES)}")
        if self.backend not in BACKENDS:
            _fail("backend", self.backend, f"one of {', '.join(BACKENDS)}")
        if self.target in LEGACY_TARGETS:
            raise NeuronConfigError(
                f"target={self.target!r} is not supported: the neuron backend runs on TorchNeuron (Neuron SDK 2.33+), "
                f"which covers {' and '.join(TARGETS)} only; for {self.target} use Neuron SDK 2.31 with optimum-neuron "
                "(torch 2.9), or --backend cpu"
            )
        if self.target is not None and self.target not in TARGETS:
            _fail("target", self.target, f"one of {', '.join(TARGETS)} or null")
        for name in ("on_device_sampling", "token_bitmask", "prompt_logprobs"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, getattr(self, name), "true or false")
        _check_speculative_tokens(self.speculative_tokens, self.sequence_length)
        if self.quantization not in (None, *QUANTIZATIONS):
            _fail("quantization", self.quantization, f"null or one of {', '.join(QUANTIZATIONS)}")
        if self.kv_cache_dtype not in (None, *KV_CACHE_DTYPES):
            _fail(
                "kv_cache_dtype", self.kv_cache_dtype, f"null (the model dtype) or one of {', '.join(KV_CACHE_DTYPES)}"
            )
        if type(self.max_logit_bias) is not int or self.max_logit_bias < 0:
            _fail("max_logit_bias", self.max_logit_bias, "an integer >= 0 (0: no logit_bias input)")
        if self.cpu_compiler not in CPU_COMPILERS:
            _fail("cpu_compiler", self.cpu_compiler, f"one of {', '.join(CPU_COMPILERS)}")
        if self.prefill_batch_size > 1 and not self.chunked:
            _fail("prefill_batch_size", self.prefill_batch_size, "1 without chunked prefill (prefill_chunk_size 0)")
        if self.prompt_logprobs and not self.chunked:
            _fail("prompt_logprobs", self.prompt_logprobs, "false without chunked prefill (prefill_chunk_size 0)")
        self._check_prefill_tail_size()
        object.__setattr__(self, "prefix_copy", self._checked_prefix_copy())
        if self.prefill_batch_size > self.batch_size:
            _fail("prefill_batch_size", self.prefill_batch_size, f"at most batch_size ({self.batch_size})")
        object.__setattr__(self, "max_logprobs", self._checked_max_logprobs())
        neuron, defaults = self.backend == "neuron", self.context_buckets is None
        limit = NEURON_MAX_DEFAULT_BUCKETS if neuron else MAX_DEFAULT_BUCKETS
        default = default_context_buckets(self.sequence_length, self.prefill_chunk_size, limit)
        object.__setattr__(self, "context_buckets", self._checked_buckets("context_buckets", default))
        decode = self.context_buckets
        if neuron and defaults:  # decode graphs compile fastest: one bucket more than the others
            decode = default_context_buckets(
                self.sequence_length, self.prefill_chunk_size, NEURON_MAX_DEFAULT_DECODE_BUCKETS
            )
        object.__setattr__(self, "decode_buckets", self._checked_buckets("decode_buckets", decode))
        object.__setattr__(self, "decode_batch_sizes", self._checked_decode_batch_sizes())
        object.__setattr__(self, "prefill_buckets", self._checked_prefill_buckets())
        object.__setattr__(self, "block_size", self._checked_block_size())
        object.__setattr__(self, "num_blocks", self._checked_num_blocks())
        object.__setattr__(self, "lora_target_modules", self._checked_lora())

    def _checked_lora(self) -> tuple[str, ...] | None:
        for name in ("max_loras", "max_lora_rank"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                _fail(name, value, "an integer >= 0 (0: no LoRA slots)")
        if (self.max_loras == 0) != (self.max_lora_rank == 0):
            _fail(
                "max_lora_rank" if self.max_loras else "max_loras",
                self.max_lora_rank if self.max_loras else self.max_loras,
                "set together with max_loras / max_lora_rank (both > 0, or both 0)",
            )
        if not self.max_loras:
            if self.lora_target_modules:
                _fail("lora_target_modules", list(self.lora_target_modules), "empty without max_loras")
            return None
        targets = LORA_TARGETS if self.lora_target_modules is None else self.lora_target_modules
        if isinstance(targets, str) or not targets or not set(targets) <= set(LORA_TARGETS):
            _fail("lora_target_modules", targets, f"a non-empty list of {', '.join(LORA_TARGETS)}")
        return tuple(t for t in LORA_TARGETS if t in targets)

    @property
    def lora(self) -> bool:
        """The graphs take LoRA slots and a per-row adapter index."""
        return self.max_loras > 0

    def _block_lengths(self) -> set[int]:
        """What a block must divide: sequence_length, the chunks and every bucket (0 aside)."""
        buckets = (*self.context_buckets, *self.decode_buckets, *self.prefill_buckets)
        return {self.sequence_length, self.prefill_chunk_size, self.prefill_tail_size, *buckets} - {0}

    def _checked_block_size(self) -> int:
        lengths = self._block_lengths()
        if self.block_size is None:
            return default_block_size(lengths)
        size = self.block_size
        if type(size) is not int or size < 1:
            _fail("block_size", size, "an integer >= 1")
        if size != self.sequence_length and any(length % size for length in lengths):
            _fail(
                "block_size", size,
                f"a divisor of sequence_length, the prefill chunk and every bucket ({sorted(lengths)}), or "
                f"sequence_length ({self.sequence_length}); {default_block_size(lengths)} is",
            )  # fmt: skip
        return size

    def _checked_num_blocks(self) -> int:
        smallest = self.blocks_per_sequence + 1
        if self.num_blocks is None:
            return self.batch_size * self.blocks_per_sequence + 1
        if type(self.num_blocks) is not int or self.num_blocks < smallest:
            _fail(
                "num_blocks", self.num_blocks,
                f"an integer >= {smallest}: one full-length sequence ({self.blocks_per_sequence} blocks of "
                f"{self.block_size}) plus the null block",
            )  # fmt: skip
        return self.num_blocks

    @property
    def blocks_per_sequence(self) -> int:
        """Block table entries per sequence: sequence_length / block_size, rounded up."""
        return -(-self.sequence_length // self.block_size)

    def _check_prefill_tail_size(self) -> None:
        tail = self.prefill_tail_size
        if type(tail) is not int or tail < 0:
            _fail("prefill_tail_size", tail, "an integer >= 0 (0: no tail graphs)")
        if tail and not 0 < tail < self.prefill_chunk_size:
            _fail("prefill_tail_size", tail, "0, or below prefill_chunk_size with chunked prefill")

    def _checked_prefix_copy(self) -> bool:
        if self.prefix_copy is None:
            return False
        if not isinstance(self.prefix_copy, bool) or (self.prefix_copy and not self.chunked):
            _fail("prefix_copy", self.prefix_copy, "true or false, and false without chunked prefill")
        return self.prefix_copy

    def _checked_max_logprobs(self) -> int:
        if self.max_logprobs is None:
            return min(DEFAULT_MAX_LOGPROBS, self.max_topk)
        if type(self.max_logprobs) is not int or not 0 <= self.max_logprobs <= self.max_topk:
            _fail("max_logprobs", self.max_logprobs, f"an integer in [0, max_topk={self.max_topk}]")
        return self.max_logprobs

    def _checked_prefill_buckets(self) -> tuple[int, ...]:
        if not self.chunked:
            if self.prefill_buckets:
                _fail("prefill_buckets", list(self.prefill_buckets), "empty without chunked prefill")
            return ()
        if self.prefill_buckets is None:
            if self.backend == "neuron":
                return doubling_prefill_buckets(self.sequence_length, self.prefill_chunk_size)
            return default_prefill_buckets(self.sequence_length, self.prefill_chunk_size)
        buckets = _int_tuple("prefill_buckets", self.prefill_buckets)
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] != 0:
            _fail("prefill_buckets", list(buckets), "strictly increasing lengths starting with 0")
        if buckets[-1] != self.sequence_length:
            _fail(
                "prefill_buckets",
                list(buckets),
                f"lengths ending with sequence_length ({self.sequence_length}), the bucket that covers every start",
            )
        return buckets

    def _checked_decode_batch_sizes(self) -> tuple[int, ...]:
        if self.decode_batch_sizes is None:
            return default_decode_batch_sizes(self.batch_size, self.backend)
        sizes = _int_tuple("decode_batch_sizes", self.decode_batch_sizes)
        if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
            _fail("decode_batch_sizes", list(sizes), "strictly increasing positive row counts")
        if sizes[-1] != self.batch_size:
            _fail("decode_batch_sizes", list(sizes), f"row counts ending with batch_size ({self.batch_size})")
        return sizes

    def _checked_buckets(self, name: str, default: tuple[int, ...]) -> tuple[int, ...]:
        """The field `name` (context_buckets or decode_buckets) checked, or `default` when it is None."""
        values = getattr(self, name)
        if values is None:
            return default
        buckets = _int_tuple(name, values)
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            _fail(name, list(buckets), "strictly increasing positive lengths")
        if buckets[-1] != self.sequence_length:
            _fail(
                name,
                list(buckets),
                f"lengths ending with sequence_length ({self.sequence_length}), the bucket that covers every position",
            )
        return buckets

    @property
    def chunked(self) -> bool:
        return self.prefill_chunk_size > 0

    @property
    def prefill_length(self) -> int:
        """Tokens per prefill graph call: the chunk size, or the whole sequence."""
        return self.prefill_chunk_size or self.sequence_length

    @property
    def prefill_graph(self) -> str:
        return "chunked_prefill" if self.chunked else "context_encoding"

    def check_model(self, max_position_embeddings: int) -> None:
        """Checks that depend on the model being compiled (what tp_degree may be: models/sharding.py)."""
        if self.sequence_length > max_position_embeddings:
            _fail(
                "sequence_length",
                self.sequence_length,
                f"at most the model's max_position_embeddings ({max_position_embeddings})",
            )

    def to_dict(self) -> dict:
        data = asdict(self)
        data["context_buckets"] = list(self.context_buckets)
        data["decode_buckets"] = list(self.decode_buckets)
        data["decode_batch_sizes"] = list(self.decode_batch_sizes)
        data["prefill_buckets"] = list(self.prefill_buckets)
        if not self.lora:  # an export without LoRA slots is written as before they existed
            for name in LORA_FIELDS:
                del data[name]
        else:
            data["lora_target_modules"] = list(self.lora_target_modules)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> NeuronConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in (
            "context_buckets",
            "decode_buckets",
            "decode_batch_sizes",
            "prefill_buckets",
            "lora_target_modules",
        ):
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        return cls(**values)

    def save(self, directory: str | Path, **extra: object) -> None:
        data = {"format_version": FORMAT_VERSION, **self.to_dict(), **extra}
        path = Path(directory) / NEURON_CONFIG_FILE
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> NeuronConfig:
        path = Path(directory) / NEURON_CONFIG_FILE
        if not path.is_file():
            raise NeuronConfigError(f"{path}: missing; is this a directory written by `optimum-cli export neuron`?")
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise NeuronConfigError(f"{path}: unreadable ({error}); export the model again") from None
        version = data.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise NeuronConfigError(
                f"{path}: format_version {version!r} is not supported by this optimum-neuron-plugin "
                f"(it reads up to {FORMAT_VERSION}); upgrade the plugin or export the model again"
            )
        if version < FORMAT_VERSION:
            raise NeuronConfigError(
                f"{path}: format_version {version} was written by an older optimum-neuron-plugin (this one reads "
                f"{FORMAT_VERSION}: the KV cache is a pool of blocks and every graph takes block tables); export the "
                f"model again: {reexport_command(data, Path(directory))}"
            )
        missing = [f.name for f in fields(cls) if f.name not in data and f.name not in OPTIONAL_FIELDS]
        if missing:
            raise NeuronConfigError(f"{path}: missing field(s) {', '.join(missing)}; export the model again")
        data = {"prefix_copy": False, **data}  # written before copy_prefix graphs existed: it has none
        try:
            return cls.from_dict(data)
        except NeuronConfigError as error:
            raise NeuronConfigError(f"{path}: {error}") from None


def default_block_size(lengths: set[int]) -> int:
    """The largest power of two up to DEFAULT_BLOCK_SIZE that divides every length."""
    size = DEFAULT_BLOCK_SIZE
    while any(length % size for length in lengths):
        size //= 2
    return size


def reexport_command(data: dict, directory: Path) -> str:
    """The export command that writes `directory` again in this format, from its old neuron_config.json `data`."""
    model = "<the model's Hugging Face id or path>"
    with contextlib.suppress(OSError, json.JSONDecodeError):
        model = json.loads((directory / "config.json").read_text()).get("_name_or_path") or model
    options = {
        "batch-size": "batch_size",
        "sequence-length": "sequence_length",
        "prefill-chunk-size": "prefill_chunk_size",
    }
    if data.get("tp_degree", 1) != 1:
        options["tensor-parallel-size"] = "tp_degree"
    flags = " ".join(f"--{flag} {data[name]}" for flag, name in options.items() if name in data)
    return f"optimum-cli export neuron --model {model} {flags} {directory}"


def default_context_buckets(
    sequence_length: int, prefill_chunk_size: int, limit: int = MAX_DEFAULT_BUCKETS
) -> tuple[int, ...]:
    """Doubling lengths from the chunk size (512 without chunking) up to sequence_length, the largest `limit` of
    them: each bucket is one more graph of each kind to compile."""
    length = min(prefill_chunk_size or 512, sequence_length)
    buckets = []
    while length < sequence_length:
        buckets.append(length)
        length *= 2
    kept = buckets[max(0, len(buckets) - (limit - 1)) :]
    return (*kept, sequence_length)


def default_prefill_buckets(sequence_length: int, chunk: int) -> tuple[int, ...]:
    """0, then multiples of the chunk size in half-octave steps (1, 2, 3, 4, 6, 8, 12, 16, ... chunks) below
    sequence_length, the largest MAX_DEFAULT_PREFILL_BUCKETS - 1 of them, then sequence_length.

    A chunk at start s attends the smallest bucket >= s: the first chunk (s = 0) only itself, and a prompt whose
    chunks start at multiples of the chunk size wastes at most a third of a bucket (none up to 4 chunks)."""
    steps, k = [], 1
    while k * chunk < sequence_length:
        steps.append(k * chunk)
        k = k + 1 if k < 4 else k + k // 2 if (k & (k - 1)) == 0 else k + k // 3
    return (0, *steps[-(MAX_DEFAULT_PREFILL_BUCKETS - 1) :], sequence_length)


def doubling_prefill_buckets(
    sequence_length: int, chunk: int, limit: int = NEURON_MAX_DEFAULT_PREFILL_BUCKETS
) -> tuple[int, ...]:
    """The neuron backend's prefill buckets: 0, then the largest `limit` - 1 doubling multiples of the chunk size
    below sequence_length, then sequence_length. A chunk attends at most twice its prior context."""
    return (0, *default_context_buckets(sequence_length, chunk, limit))


def default_decode_batch_sizes(batch_size: int, backend: str = "cpu") -> tuple[int, ...]:
    """cpu: one row and batch_size rows, so a lone request (concurrency 1, the tail of a batch) attends and samples
    one row instead of batch_size; any other count pads up to batch_size. neuron: batch_size rows only (one graph
    per decode bucket; --decode-batch-sizes 1,B adds the one-row graphs)."""
    if backend == "neuron":
        return (batch_size,)
    return (1, batch_size) if batch_size > 1 else (1,)


def _check_speculative_tokens(value: object, sequence_length: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        _fail("speculative_tokens", value, "an integer >= 0 (0: no verify graphs)")
    if value + 1 > sequence_length:
        _fail("speculative_tokens", value, f"below sequence_length ({sequence_length}): a row verifies k + 1 tokens")


def _int_tuple(name: str, values: object) -> tuple[int, ...]:
    if isinstance(values, int | str) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        _fail(name, values, "a list of integers")
    return tuple(values)


def _require_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        _fail(name, value, "an integer >= 1")


def _fail(name: str, value: object, allowed: str) -> None:
    raise NeuronConfigError(f"{name}={value!r} is not allowed: must be {allowed}")
