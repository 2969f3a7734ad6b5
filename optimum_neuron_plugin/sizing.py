"""Sizing: what one rank of an export holds in device memory, against one logical NeuronCore's HBM.

Per rank (tensor parallelism splits heads, the MLP and the vocabulary; models/sharding.py):
- weights: every weight of the rank's shard in the export's dtype (the same count as models/sharding.py slices),
  one byte for the FP8 projections of a --quantize fp8 or FP8-checkpoint export;
- KV cache: the compiled pool of num_blocks blocks (the null block included), each block_size tokens x layers x 2
  (K and V) x the rank's KV heads x head_dim, in that dtype (one byte with --kv-cache-dtype fp8);
- activations: an estimate of the largest graph's live tensors (activation_bytes), the largest over the export's
  graphs;
- a runtime reserve (RUNTIME_RESERVE): the Neuron runtime's own buffers, the NEFF's instructions and I/O tensors.
The estimate is conservative on purpose: refusing an export that would have fitted costs a flag, accepting one that
does not costs hours of compilation before the load fails.

The plan speaks of the KV cache in blocks: the pool compiled, and the pool the core can hold once the weights,
activations and reserve are placed, in blocks, tokens and requests of an average length (a request of L tokens takes
ceil(L / block_size) blocks). On Neuron the pool's size is a shape of every graph that reads the cache (a NEFF is
compiled per input shape), so it is chosen at export.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .config import NeuronConfig
from .graphs import COPY_PREFIX, PROMPT_LOGITS, VERIFY, GraphSpec, graph_specs
from .models import lora
from .models.args import ModelArgs
from .models.sharding import ShardingError, layout_for, local_args

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
RUNTIME_RESERVE = 1 * GIB
# The Neuron runtime's variable for the logical NeuronCore configuration (physical cores per logical core).
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
# Largest tensor-parallel degree looked at when suggesting one (a trn2.48xlarge has 16 chips: 64 logical cores at
# LNC=2, 128 at LNC=1).
MAX_TP = 128


@dataclass(frozen=True)
class Chip:
    """One Trainium chip: its HBM, its physical NeuronCores and the default LNC (physical cores per logical core)."""

    name: str
    hbm_gib: int
    physical_cores: int
    default_lnc: int
    source: str

    def core_bytes(self, lnc: int) -> int:
        """One logical NeuronCore's fair share of the chip's HBM: the chip's memory divided among its logical cores
        (lnc physical cores each). A share, not a documented per-core limit: a trn2's 96 GiB sit in 4 HBM stacks of
        24 GiB for 8 physical cores (two to a stack at LNC=1, a pairing read from the counts). The plan assumes
        every core of the chip serves (one model per core, or tensor parallelism over them)."""
        return self.hbm_gib * GIB * lnc // self.physical_cores


CHIPS = {
    "trn2": Chip(
        "trn2", 96, 8, 2,
        "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium2.html",
    ),
    "trn3": Chip(
        "trn3", 144, 8, 2,
        "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium3.html",
    ),
}  # fmt: skip


class SizingError(ValueError):
    """The export cannot fit one logical NeuronCore; the message says what would."""


@dataclass(frozen=True)
class KVPool:
    """The compiled KV pool of one rank: num_blocks blocks of block_size tokens, block 0 the null block."""

    num_blocks: int
    block_size: int
    block_bytes: int  # one block's K and V over every layer of the rank
    average_length: int  # tokens of an average request, to count requests

    @property
    def bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def blocks_per_request(self) -> int:
        return -(-self.average_length // self.block_size)

    def holding(self, blocks: int) -> str:
        """`blocks` blocks (the null block included) in tokens and requests of the average length."""
        usable = max(blocks - 1, 0)
        requests = usable // self.blocks_per_request
        tokens = usable * self.block_size
        return f"{blocks:,} blocks = {tokens:,} tokens = {requests:,} requests of {self.average_length:,} tokens"


@dataclass(frozen=True)
class MemoryPlan:
    tp_degree: int
    weights: int
    pool: KVPool
    activations: int
    largest_graph: str
    chip: Chip | None  # None: the cpu backend (no device limit)
    lnc: int
    rows: int  # batch_size: the requests a graph call runs at once
    lora: int = 0  # LoRA slots (every slot, slot 0 included): lora_bytes
    lora_slots: str = ""  # what they are, for the plan's line

    @property
    def kv_cache(self) -> int:
        return self.pool.bytes

    @property
    def total(self) -> int:
        return self.weights + self.lora + self.kv_cache + self.activations + RUNTIME_RESERVE

    @property
    def blocks_that_fit(self) -> int | None:
        """The pool (null block included) the core holds besides the weights, activations and reserve."""
        if self.capacity is None:
            return None
        free = self.capacity - self.weights - self.lora - self.activations - RUNTIME_RESERVE
        return max(free // self.pool.block_bytes, 0)

    @property
    def capacity(self) -> int | None:
        return self.chip.core_bytes(self.lnc) if self.chip else None

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.total <= self.capacity

    def lines(self) -> list[str]:
        lines = [
            f"memory per rank (tensor parallel {self.tp_degree}):",
            f"  weights      {_gib(self.weights)}",
            *([f"  LoRA slots   {_gib(self.lora)} ({self.lora_slots})"] if self.lora else []),
            f"  KV cache     {_gib(self.kv_cache)} ({self.pool.num_blocks:,} blocks of {self.pool.block_size:,} "
            "tokens)",
            f"  activations  {_gib(self.activations)} (estimate, largest graph {self.largest_graph})",
            f"  reserve      {_gib(RUNTIME_RESERVE)} (Neuron runtime, NEFF I/O)",
            f"  total        {_gib(self.total)}",
        ]
        if self.chip is None:
            lines.append("  (cpu backend: information only, no device limit)")
        else:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(
                f"  one {self.chip.name} logical NeuronCore at LNC={self.lnc}: {_gib(self.capacity)} "
                f"({self.chip.hbm_gib} GiB per chip / {self.chip.physical_cores // self.lnc} logical cores, a fair "
                f"share): {verdict}"
            )
        return lines + self.pool_lines()

    def pool_lines(self) -> list[str]:
        pool = self.pool
        lines = [
            f"KV pool: blocks of {pool.block_size:,} tokens ({pool.block_bytes / 1024**2:,.2f} MiB per rank), block 0 "
            f"the null block; a request of {pool.average_length:,} tokens (--average-length) takes "
            f"{pool.blocks_per_request:,}",
            f"  compiled     {pool.holding(pool.num_blocks)} (--num-blocks {pool.num_blocks}; {self.rows:,} rows per "
            "graph call)",
        ]
        if self.blocks_that_fit is not None:
            lines.append(
                f"  core holds   {pool.holding(self.blocks_that_fit)} after the weights (--num-blocks "
                f"{self.blocks_that_fit})"
            )
        return lines


def lnc_from_env(chip: Chip) -> int:
    value = os.environ.get(LNC_ENV, "")
    return int(value) if value in ("1", "2") else chip.default_lnc


def plan_memory(
    args: ModelArgs, nc: NeuronConfig, chip: Chip | None, lnc: int | None = None, average_length: int | None = None
) -> MemoryPlan:
    """What one rank of the export `nc` of the model `args` holds (raises ShardingError for a bad tp_degree);
    requests are counted at `average_length` tokens (default: half of sequence_length)."""
    lnc = lnc or (chip.default_lnc if chip else 1)
    specs = graph_specs(nc, args.vocab_size)
    largest = max(specs, key=lambda spec: activation_bytes(args, nc, spec))
    return MemoryPlan(
        tp_degree=nc.tp_degree,
        weights=weight_bytes(args, nc),
        pool=kv_pool(args, nc, average_length),
        activations=activation_bytes(args, nc, largest),
        largest_graph=largest.key,
        chip=chip,
        lnc=lnc,
        rows=nc.batch_size,
        lora=lora_bytes(args, nc),
        lora_slots=f"{nc.max_loras} + the base model's of rank {nc.max_lora_rank}" if nc.lora else "",
    )


def lora_bytes(args: ModelArgs, nc: NeuronConfig) -> int:
    """One rank's LoRA slots (models/lora.py), slot 0 included: per slot, layer and targeted projection, its shard of
    (in + out) * rank (a column-parallel projection's B split, a row-parallel one's A split)."""
    if not nc.lora:
        return 0
    local = local_args(args, layout_for(args, nc.tp_degree))
    per_slot = 0
    for layer in range(args.num_hidden_layers):
        for target in lora.targets(args, layer, nc.lora_target_modules):
            (fan_in, fan_out), (local_in, local_out) = lora.shape(args, target), lora.shape(local, target)
            per_slot += local_in + fan_out if target in ("o_proj", "down_proj") else fan_in + local_out
    return per_slot * nc.max_lora_rank * DTYPE_BYTES[nc.torch_dtype] * (nc.max_loras + 1)


def kv_pool(args: ModelArgs, nc: NeuronConfig, average_length: int | None = None) -> KVPool:
    length = max(nc.sequence_length // 2, 1) if average_length is None else average_length
    if not 1 <= length <= nc.sequence_length:
        raise ValueError(
            f"--average-length {length} is not allowed: must be in [1, sequence_length={nc.sequence_length}]"
        )
    return KVPool(nc.num_blocks, nc.block_size, nc.block_size * kv_bytes_per_token(args, nc), length)


def weight_bytes(args: ModelArgs, nc: NeuronConfig) -> int:
    """One rank's weights: FP8 projections (docs/fp8.md) take one byte each, the rest the export's dtype (their
    per-channel scales, under 0.1% of the bytes, are left out)."""
    width = DTYPE_BYTES[nc.torch_dtype]
    fp8 = projection_count(args, nc.tp_degree) if nc.quantization else 0
    return fp8 + (weight_count(args, nc.tp_degree) - fp8) * width


def projection_count(args: ModelArgs, degree: int) -> int:
    """Elements of one rank's attention and dense MLP projections: what an FP8 export stores in FP8."""
    plan = layout_for(args, degree)
    h, q, kv = args.hidden_size, plan.heads * args.head_dim, plan.kv_heads * args.head_dim
    mlp = sum(0 if args.is_moe(layer) else 3 * plan.intermediate * h for layer in range(args.num_hidden_layers))
    return args.num_hidden_layers * (h * (q + 2 * kv) + q * h) + mlp


def weight_count(args: ModelArgs, degree: int) -> int:
    """Elements of one rank's weights (norms and biases included; the vocabulary padded to a multiple of degree)."""
    plan = layout_for(args, degree)
    h, d = args.hidden_size, args.head_dim
    vocab = plan.local_vocab if degree > 1 else args.vocab_size
    count = vocab * h * (1 if args.tie_word_embeddings else 2) + h
    for layer in range(args.num_hidden_layers):
        q, kv = plan.heads * d, plan.kv_heads * d
        count += h * (q + 2 * kv) + q * h + (4 if args.sandwich_norms else 2) * h
        count += (q + 2 * kv) if args.qkv_bias else 0
        count += 2 * d if args.qk_norm else 0
        if args.is_moe(layer):
            count += args.num_experts * (3 * plan.moe_intermediate * h + h)  # experts and the router
        else:
            count += 3 * plan.intermediate * h
    return count


def kv_bytes_per_token(args: ModelArgs, nc: NeuronConfig) -> int:
    """One token's K and V over every layer of a rank."""
    kv_heads = layout_for(args, nc.tp_degree).kv_heads
    width = 1 if nc.kv_cache_dtype == "fp8" else DTYPE_BYTES[nc.torch_dtype]
    return args.num_hidden_layers * 2 * kv_heads * args.head_dim * width


def activation_bytes(args: ModelArgs, nc: NeuronConfig, spec: GraphSpec) -> int:
    """Estimate of one graph's live activations on a rank: one layer's working set (layers run one after another)
    plus the logits.
    - tokens T = rows x tokens (+ the prompt chunk of chunk_and_decode);
    - hidden states: 4 x T x hidden (residual, normed input, attention output, MLP output);
    - q, k, v: T x (heads + 2 kv heads) x head_dim; MLP: 2 x T x the rank's intermediate (gate, up), or per routed
      expert for a MoE layer;
    - attention scores in fp32: the rank's heads x T x (bucket + T) (the chunk attends the bucket and itself);
    - logits in fp32: each output row x the rank's vocabulary, and the whole vocabulary once gathered;
    - neuron backend: the K and V blocks of the bucket gathered through each row's block table (the prompt chunk of
      chunk_and_decode a row of its own), in the cache's dtype."""
    if spec.name == COPY_PREFIX:
        return 0
    plan = layout_for(args, nc.tp_degree)
    width = DTYPE_BYTES[nc.torch_dtype]
    tokens = spec.computed_tokens
    mlp = plan.intermediate
    if args.num_experts:
        mlp = max(mlp, args.num_experts_per_tok * plan.moe_intermediate)
    layer = tokens * (4 * args.hidden_size + (plan.heads + 2 * plan.kv_heads) * args.head_dim + 2 * mlp) * width
    scores = plan.heads * tokens * (spec.bucket + tokens) * 4
    every_row = spec.name in (PROMPT_LOGITS, VERIFY)
    rows = (tokens if every_row else spec.rows) + (1 if spec.chunk else 0)
    logits = rows * (plan.local_vocab + (args.vocab_size if nc.tp_degree > 1 else 0)) * 4
    reading = spec.rows + (1 if spec.chunk else 0)
    gathered = reading * spec.bucket * kv_bytes_per_token(args, nc) // args.num_hidden_layers
    return layer + scores + logits + (gathered if nc.backend == "neuron" else 0)


def smallest_fitting_tp(args: ModelArgs, nc: NeuronConfig, chip: Chip, lnc: int) -> int | None:
    """The smallest tensor-parallel degree (allowed by the model's heads) at which a rank fits, or None."""
    from dataclasses import replace

    for degree in range(1, MAX_TP + 1):
        try:
            candidate = replace(nc, tp_degree=degree)
            if plan_memory(args, candidate, chip, lnc).fits:
                return degree
        except ShardingError:
            continue
    return None


def check_fits(plan: MemoryPlan, args: ModelArgs, nc: NeuronConfig) -> None:
    """Refuses an export whose rank cannot fit one logical NeuronCore, naming the pool the core holds after the
    weights (when it holds a request of sequence_length tokens) and the smallest tensor-parallel degree that fits."""
    if plan.fits:
        return
    chip, pool = plan.chip, plan.pool
    need = (
        f"{_gib(plan.total)} per rank, one {chip.name} logical NeuronCore at LNC={plan.lnc} holds {_gib(plan.capacity)}"
    )
    fixes = []
    if plan.blocks_that_fit >= nc.blocks_per_sequence + 1:  # a full-length request and the null block
        fixes.append(f"--num-blocks {plan.blocks_that_fit}")
    degree = smallest_fitting_tp(args, nc, chip, plan.lnc)
    if degree is not None:
        fixes.append(f"--tensor-parallel-size {degree} (the smallest that fits)")
    fix = "use " + ", or ".join(fixes) if fixes else "lower --num-blocks or --sequence-length"
    raise SizingError(
        f"this export does not fit: {need} (weights {_gib(plan.weights)}, KV cache {_gib(plan.kv_cache)} = "
        f"{pool.num_blocks:,} blocks of {pool.block_size:,} tokens, activations {_gib(plan.activations)}); after the "
        f"weights the core holds {pool.holding(plan.blocks_that_fit)}: {fix}"
    )


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f} GiB"
