"""Checkpoint weights under the decoder's names: fused projections (Phi-3's qkv_proj, gate_up_proj, the MoE experts'
stacked gate_up_proj) split on load.

The artifact stores the split weights: the graphs and the tensor-parallel plan see one layout for every family.
"""

from __future__ import annotations

import torch

from .args import ModelArgs


def decoder_weights(state_dict: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """state_dict with every fused projection replaced by its parts (other weights untouched)."""
    out = dict(state_dict)
    q_rows = args.num_attention_heads * args.head_dim
    kv_rows = args.num_key_value_heads * args.head_dim
    for name in [n for n in state_dict if n.endswith("self_attn.qkv_proj.weight")]:
        prefix = name.removesuffix("qkv_proj.weight")
        for suffix in ("weight", "weight_scale"):  # an FP8 weight's scale rows split with its rows
            if prefix + "qkv_proj." + suffix in out:
                q, k, v = out.pop(prefix + "qkv_proj." + suffix).split([q_rows, kv_rows, kv_rows])
                out |= {prefix + f"{x}_proj.{suffix}": t.contiguous() for x, t in zip("qkv", (q, k, v), strict=True)}
    for name in [n for n in state_dict if n.endswith("mlp.gate_up_proj.weight")]:
        prefix = name.removesuffix("gate_up_proj.weight")
        for suffix in ("weight", "weight_scale"):
            if prefix + "gate_up_proj." + suffix in out:
                gate, up = out.pop(prefix + "gate_up_proj." + suffix).chunk(2)  # Phi-3: gate rows first, then up
                out |= {
                    prefix + f"gate_proj.{suffix}": gate.contiguous(),
                    prefix + f"up_proj.{suffix}": up.contiguous(),
                }
    if args.architecture == "GptOssForCausalLM":
        return _gpt_oss_experts(out)
    for name in [n for n in state_dict if n.endswith("mlp.experts.gate_up_proj")]:
        prefix = name.removesuffix("gate_up_proj")
        gate, up = out.pop(name).chunk(2, dim=1)  # [E, 2I, hidden]: each expert's gate rows, then its up rows
        out |= {prefix + "gate_proj": gate.contiguous(), prefix + "up_proj": up.contiguous()}
    return out


def _gpt_oss_experts(out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt-oss stores its experts transposed ([E, in, out]) with gate and up interleaved column by column, and names
    its router `router`: the same layout as the other MoE families once split, transposed and renamed."""
    for name in [n for n in out if n.endswith("mlp.experts.gate_up_proj")]:
        prefix = name.removesuffix("gate_up_proj")
        fused, bias = out.pop(name), out.pop(prefix + "gate_up_proj_bias")  # [E, hidden, 2I], [E, 2I]
        out[prefix + "gate_proj"] = fused[..., ::2].transpose(1, 2).contiguous()
        out[prefix + "up_proj"] = fused[..., 1::2].transpose(1, 2).contiguous()
        out[prefix + "gate_proj_bias"] = bias[:, ::2].contiguous()
        out[prefix + "up_proj_bias"] = bias[:, 1::2].contiguous()
        down = out[prefix + "down_proj"]  # [E, I, hidden]
        out[prefix + "down_proj"] = down.transpose(1, 2).contiguous()
    for name in [n for n in out if ".mlp.router." in n]:
        out[name.replace(".mlp.router.", ".mlp.gate.")] = out.pop(name)
    return out
