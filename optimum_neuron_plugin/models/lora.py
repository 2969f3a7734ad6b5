"""LoRA as data: each targeted projection of each layer holds its adapters stacked in slots, A [slots, in, R] and
B [slots, R, out], slot 0 all zeros (the base model), and every graph row names its slot (an adapter index input).
A row's output is the projection's plus x @ A[slot] @ B[slot], its scaling folded into B when the adapter is loaded
(runtime/lora/): loading an adapter is a copy into its slot, never a recompile.

The stacked weights are graph inputs like the model's (params), named after the projection: `<projection>.lora_A`
and `<projection>.lora_B`. They start at zero and are never stored in the artifact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .args import ModelArgs

A, B = ".lora_A", ".lora_B"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def is_slot_stack(name: str) -> bool:
    return name.endswith((A, B))


def projection(layer: int, target: str) -> str:
    """The projection's weight name without `.weight`, as in the Hugging Face checkpoint."""
    return f"model.layers.{layer}.{'self_attn' if target in ATTENTION else 'mlp'}.{target}"


def targets(args: ModelArgs, layer: int, modules: tuple[str, ...]) -> list[str]:
    """The targets a layer holds slots for: a mixture-of-experts layer has no dense MLP projections."""
    return [t for t in modules if t in ATTENTION or not args.is_moe(layer)]


def shape(args: ModelArgs, target: str) -> tuple[int, int]:
    """(in, out) features of a projection of the full model."""
    hidden, heads, d = args.hidden_size, args.num_attention_heads * args.head_dim, args.head_dim
    return {
        "q_proj": (hidden, heads),
        "k_proj": (hidden, args.num_key_value_heads * d),
        "v_proj": (hidden, args.num_key_value_heads * d),
        "o_proj": (heads, hidden),
        "gate_proj": (hidden, args.intermediate_size),
        "up_proj": (hidden, args.intermediate_size),
        "down_proj": (args.intermediate_size, hidden),
    }[target]


def empty_params(args: ModelArgs, slots: int, rank: int, modules: tuple[str, ...], dtype: torch.dtype) -> dict:
    """The zero A [slots, in, rank] and B [slots, rank, out] of every targeted projection (slots: max_loras + 1)."""
    params = {}
    for layer in range(args.num_hidden_layers):
        for target in targets(args, layer, modules):
            fan_in, fan_out = shape(args, target)
            name = projection(layer, target)
            params[name + A] = torch.zeros(slots, fan_in, rank, dtype=dtype)
            params[name + B] = torch.zeros(slots, rank, fan_out, dtype=dtype)
    return params


def slot_bytes(args: ModelArgs, rank: int, modules: tuple[str, ...], dtype_bytes: int) -> int:
    """Device bytes one slot holds: (in + out) * rank per targeted projection and layer."""
    return sum(
        sum(shape(args, t)) * rank * dtype_bytes
        for layer in range(args.num_hidden_layers)
        for t in targets(args, layer, modules)
    )


def projection_count(args: ModelArgs, modules: tuple[str, ...]) -> int:
    """The projections of the model that hold slots (every layer's targets)."""
    return sum(len(targets(args, layer, modules)) for layer in range(args.num_hidden_layers))


def operations_per_projection(row_groups: int) -> int:
    """The operations LoraRows.apply adds to a graph for one targeted projection (what its compiler is handed):
    per row group a select (and a slice when the call has several groups), a reshape, two index_selects, two bmm and
    a reshape; then the add, with a cat and an unsqueeze for several groups. --max-loras and --max-lora-rank change
    the inputs' shapes, never this count. tests/cli/test_plan.py counts them in exported graphs."""
    return 8 if row_groups == 1 else 8 * row_groups + 3


@dataclass(frozen=True)
class LoraRows:
    """The slot of every row of a call, per row group ([n] int32 each), and the groups' (n, T) shapes: the tokens
    of a [1, tokens, in] activation are the groups' rows in order (models/decoder.py, groups_logits)."""

    slots: list[torch.Tensor]
    shapes: list[tuple[int, int]]

    def apply(self, params: dict, name: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (the projection `name` of x [1, tokens, in]) plus each row's adapter delta; y as it is for a projection
        without slots."""
        if name + A not in params:
            return y
        a, b = params[name + A], params[name + B]
        deltas, start = [], 0
        for slots, (n, t) in zip(self.slots, self.shapes, strict=True):
            rows = x[0, start : start + n * t].reshape(n, t, -1)
            # index_select takes the int32 slots as they are (no int64 index on the device)
            a_rows, b_rows = a.index_select(0, slots), b.index_select(0, slots)
            deltas.append(torch.bmm(torch.bmm(rows, a_rows), b_rows))
            start += n * t
        # Every operation here is in every graph, for every targeted projection of every layer: no copy that does
        # nothing (a cast to y's own dtype, a view then another) reaches the compiler (operations_per_projection).
        if len(deltas) == 1:
            delta = deltas[0].reshape(y.shape)
        else:
            delta = torch.cat([d.reshape(-1, d.shape[-1]) for d in deltas])[None]
        return y + (delta if delta.dtype == y.dtype else delta.to(y.dtype))
