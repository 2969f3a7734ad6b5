"""Tensor-parallel sharding of every family (ShardLayout): which slice of each weight rank r holds.

- q/k/v/gate/up are column-parallel (rank r computes its heads / its slice of the MLP), o/down row-parallel
  (each rank's partial sum, then an all-reduce in the graph).
- KV heads are sharded when kv_heads % tp == 0; when tp % kv_heads == 0 each rank holds one whole KV head,
  the one its query heads use (each KV head replicated on tp / kv_heads ranks); anything else is refused.
- The vocabulary (embedding and lm_head, tied or not) is split in equal slices of ceil(V / tp) rows, the last
  one padded with zero rows; the graphs mask padded logits and offset token ids by VOCAB_OFFSET.
- FP8 weights' scales follow their rows; a row-parallel weight's per-channel scales are replicated, its block
  scales split with its columns. Attention sinks (gpt-oss) follow their query heads. Norms (Qwen3's q/k norms included) are replicated; biases follow their rows (q/k/v) or are added once after
  the all-reduce (o).
- MoE layers: every expert is sharded like the dense MLP (its gate/up rows and down columns, stacked [E, ...]),
  the router replicated.
- LoRA slots (models/lora.py) follow their projection: B split with a column-parallel one's rows, A with a
  row-parallel one's columns, the other replicated; a row-parallel delta is a partial sum, added before the all-reduce. Each rank reads 1/tp of each selected expert, so a decode step's weight reads are
  spread evenly whatever the router picks (expert parallelism would leave the ranks holding no selected expert
  idle), and the block needs the dense MLP's one all-reduce.

The artifact stores the full weights once; each rank slices its shard at load (shard_params).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..config import NeuronConfigError
from . import fp8, lora
from .args import ModelArgs

# Per-rank scalar weight: the global id of the rank's first vocabulary row (the graphs are rank-independent).
VOCAB_OFFSET = "tp.vocab_offset"


class ShardingError(NeuronConfigError):
    """The model cannot be split over this many ranks; the message says what to change."""


@dataclass(frozen=True)
class ShardLayout:
    degree: int
    heads: int  # query heads per rank
    kv_heads: int  # KV heads per rank
    kv_replicas: int  # ranks holding each KV head (1: sharded)
    intermediate: int  # MLP columns per rank
    moe_intermediate: int  # each expert's MLP columns per rank
    vocab: int  # the model's vocabulary
    local_vocab: int  # vocabulary rows per rank, padded: degree * local_vocab >= vocab

    def kv_head_start(self, rank: int) -> int:
        """The first of this rank's KV heads in the full model."""
        return (rank // self.kv_replicas) * self.kv_heads


def check_degree(degree: int, heads: int, kv_heads: int, intermediate: int, expert: int = 0) -> str | None:
    """Why `degree` ranks cannot share the model, or None. The one source of truth for what divides."""
    if heads % degree or (kv_heads % degree and degree % kv_heads) or intermediate % degree or expert % degree:
        experts = f", expert MLP size ({expert})" if expert else ""
        return (
            f"a divisor of the model's attention heads ({heads}), MLP size ({intermediate}){experts} "
            f"that divides or is a multiple of its key/value heads ({kv_heads})"
        )
    return None


def layout_for(args: ModelArgs, degree: int) -> ShardLayout:
    why = check_degree(
        degree, args.num_attention_heads, args.num_key_value_heads, args.intermediate_size, args.moe_intermediate_size
    )
    if why:
        raise ShardingError(f"tp_degree={degree} is not allowed: must be {why}")
    kv = args.num_key_value_heads
    replicas = degree // kv if degree > kv else 1
    return ShardLayout(
        degree=degree,
        heads=args.num_attention_heads // degree,
        kv_heads=max(kv // degree, 1),
        kv_replicas=replicas,
        intermediate=args.intermediate_size // degree,
        moe_intermediate=args.moe_intermediate_size // degree,
        vocab=args.vocab_size,
        local_vocab=-(-args.vocab_size // degree),
    )


def local_args(args: ModelArgs, layout: ShardLayout) -> ModelArgs:
    """The architecture one rank's graph sees: its heads and MLP slice (hidden size and vocabulary unchanged)."""
    return replace(
        args,
        num_attention_heads=layout.heads,
        num_key_value_heads=layout.kv_heads,
        intermediate_size=layout.intermediate,
        moe_intermediate_size=layout.moe_intermediate,
    )


def shard_params(params: dict[str, torch.Tensor], args: ModelArgs, layout: ShardLayout, rank: int) -> dict:
    """Rank `rank`'s slice of every weight (copies, so the full weights can be freed)."""
    if layout.degree == 1:
        return params
    q_rows, kv_rows, mlp_rows = _projection_rows(args, layout, rank)
    expert_rows = slice(rank * layout.moe_intermediate, (rank + 1) * layout.moe_intermediate)
    shards = {}
    for name, tensor in params.items():
        kind = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else name
        if name.endswith((lora.A, lora.B)):
            shard = lora_shard(name, tensor, args, layout, rank)
        elif ".experts." in name:
            shard = _expert_shard(name.rsplit(".", 1)[-1], tensor, expert_rows)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            shard = _vocab_rows(tensor, layout, rank)
        elif name.endswith("self_attn.sinks"):
            shard = tensor[rank * layout.heads : (rank + 1) * layout.heads]
        elif kind == "q_proj":
            shard = tensor[q_rows]
        elif kind in ("k_proj", "v_proj"):
            shard = tensor[kv_rows]
        elif kind in ("gate_proj", "up_proj"):
            shard = tensor[mlp_rows]
        elif kind in ("o_proj", "down_proj") and name.endswith("weight_scale"):
            shard = _column_scales(name, tensor, q_rows if kind == "o_proj" else mlp_rows)
        elif kind == "o_proj" and name.endswith("weight"):
            shard = tensor[:, q_rows]
        elif kind == "down_proj":
            shard = tensor[:, mlp_rows]
        else:  # norms and the o bias: replicated
            shard = tensor
        shards[name] = shard.contiguous().clone()
    shards[VOCAB_OFFSET] = torch.tensor([rank * layout.local_vocab], dtype=torch.int32)  # added to int32 token ids
    return shards


def _projection_rows(args: ModelArgs, layout: ShardLayout, rank: int) -> tuple[slice, slice, slice]:
    """Rank `rank`'s output rows of q, of k and v, and of gate and up (o and down: the same columns)."""
    d = args.head_dim
    q_rows = slice(rank * layout.heads * d, (rank + 1) * layout.heads * d)
    kv_start = layout.kv_head_start(rank) * d
    kv_rows = slice(kv_start, kv_start + layout.kv_heads * d)
    mlp_rows = slice(rank * layout.intermediate, (rank + 1) * layout.intermediate)
    return q_rows, kv_rows, mlp_rows


def lora_shard(name: str, tensor: torch.Tensor, args: ModelArgs, layout: ShardLayout, rank: int) -> torch.Tensor:
    """A LoRA slot stack split like its projection (models/lora.py): a column-parallel projection's B [slots, R, out]
    by its output rows (A replicated), a row-parallel one's A [slots, in, R] by its input columns (B replicated)."""
    if layout.degree == 1:
        return tensor
    kind = name.rsplit(".", 2)[-2]
    q_rows, kv_rows, mlp_rows = _projection_rows(args, layout, rank)
    rows = {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows, "gate_proj": mlp_rows, "up_proj": mlp_rows}
    if kind in rows:
        return tensor[:, :, rows[kind]] if name.endswith(lora.B) else tensor
    columns = q_rows if kind == "o_proj" else mlp_rows
    return tensor[:, columns] if name.endswith(lora.A) else tensor


def _column_scales(name: str, scale: torch.Tensor, columns: slice) -> torch.Tensor:
    """A row-parallel FP8 weight's scales: per output channel, replicated (each rank scales its partial sum by them);
    per 128-column block, the blocks of the rank's columns, which must start and end on a block."""
    if scale.dim() == 1:
        return scale
    if columns.start % fp8.BLOCK or columns.stop % fp8.BLOCK:
        raise ShardingError(
            f"{name}: its 128-column FP8 block scales cannot be split at column {columns.start}-{columns.stop}: use a "
            "tensor-parallel degree whose column shards are multiples of 128"
        )
    return scale[:, columns.start // fp8.BLOCK : columns.stop // fp8.BLOCK]


def _expert_shard(kind: str, tensor: torch.Tensor, rows: slice) -> torch.Tensor:
    """Stacked experts [E, ...]: gate/up rows (and their biases) and down columns; the down bias is replicated."""
    if kind in ("gate_proj", "up_proj", "gate_proj_bias", "up_proj_bias"):
        return tensor[:, rows]
    if kind == "down_proj":
        return tensor[:, :, rows]
    return tensor


def _vocab_rows(table: torch.Tensor, layout: ShardLayout, rank: int) -> torch.Tensor:
    start = rank * layout.local_vocab
    rows = table[start : start + layout.local_vocab]
    pad = layout.local_vocab - rows.shape[0]
    return torch.cat((rows, rows.new_zeros(pad, rows.shape[1]))) if pad else rows
