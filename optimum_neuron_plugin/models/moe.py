"""The mixture-of-experts block: a top-k router and experts stored as stacked weights [E, ...].

Routing (each family's normalisation, models.args.ROUTERS):
- "softmax_topk": softmax over every expert in fp32, then the top k (Qwen3-MoE, Mixtral), renormalised over
  the k when `norm_topk_prob` (Mixtral always: the same as a softmax over the top-k logits);
- "topk_softmax": the top k logits (router bias added), then a softmax over them (gpt-oss).

Two ways to run the experts, chosen per graph from its static token count T (`gathers_experts`):
- gather: each token's k experts' weights are gathered by the router's indices into fixed [T, k, ...] tensors and
  applied by batched matmuls. The graph reads T * k experts' weights: a decode step reads only what it uses.
- dense: every expert runs on every token and the outputs are summed with the routing weights (zero for the
  experts a token did not pick). It reads each expert once whatever T: cheaper once T * k exceeds E.

Under tensor parallelism every expert is sharded like the dense MLP (gate/up columns, down rows): one all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .args import ModelArgs
from .collectives import SINGLE, Collectives
from .layers import activation

Params = dict[str, torch.Tensor]
EXPERT_WEIGHTS = ("gate_proj", "up_proj", "down_proj")


def moe_weight_names(args: ModelArgs, prefix: str) -> list[str]:
    """The router's and the stacked experts' weights of one MoE layer (prefix "model.layers.i.mlp.")."""
    names = [prefix + "gate.weight"] + [prefix + "experts." + w for w in EXPERT_WEIGHTS]
    if args.router_bias:
        names.append(prefix + "gate.bias")
    if args.expert_bias:
        names += [prefix + "experts." + w + "_bias" for w in EXPERT_WEIGHTS]
    return names


def gathers_experts(tokens: int, args: ModelArgs) -> bool:
    """Whether a graph of `tokens` tokens gathers its tokens' experts (fewer weight reads than every expert)."""
    return tokens * args.num_experts_per_tok < args.num_experts


def route(args: ModelArgs, params: Params, prefix: str, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h [T, hidden] -> (routing weights [T, k], expert indices [T, k]), as the family's router computes them."""
    logits = F.linear(h, params[prefix + "gate.weight"], params.get(prefix + "gate.bias"))
    k = args.num_experts_per_tok
    if args.router == "topk_softmax":
        top, index = torch.topk(logits, k, dim=-1)
        return torch.softmax(top, dim=-1), index
    top, index = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
    if args.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return (top if args.router_weights_fp32 else top.to(h.dtype)), index


def moe(
    args: ModelArgs, params: Params, prefix: str, h: torch.Tensor, cc: Collectives = SINGLE, gather: bool | None = None
) -> torch.Tensor:
    """The MoE block of layer `prefix` ("model.layers.i.mlp.") on h [..., hidden]; summed over the TP ranks.
    `gather`: gather the tokens' experts or run every expert; None: whichever reads fewer weights (gathers_experts)."""
    shape = h.shape
    x = h.reshape(-1, shape[-1])
    weights, index = route(args, params, prefix, x)
    e = prefix + "experts."
    gather = gathers_experts(x.shape[0], args) if gather is None else gather
    run = gathered_experts if gather else dense_experts
    out = cc.all_reduce(run(args, params, e, x, weights, index))
    bias = params.get(e + "down_proj_bias")
    if bias is not None:  # after the all-reduce: once, not once per rank
        out = out + _mix(weights, index, bias, args.num_experts).to(out.dtype)
    return out.reshape(shape)


def gathered_experts(args, params, e, x, weights, index) -> torch.Tensor:
    """Each token through its own k experts: weights gathered into [T * k, out, in], then batched matmuls."""
    t, k = index.shape
    flat = index.reshape(-1)

    def project(name: str, inputs: torch.Tensor, bias: bool = True) -> torch.Tensor:  # [T * k, in] -> [T * k, out]
        w = params[e + name].index_select(0, flat)
        # inputs as [T * k, 1, in] against w^T: a row times a matrix per expert (the [out, in] x [in, 1] form runs
        # ~100x slower on the CPU's batched GEMM)
        out = torch.bmm(inputs[:, None, :], w.transpose(1, 2))[:, 0]
        b = params.get(e + name + "_bias") if bias else None
        return out if b is None else out + b.index_select(0, flat)

    xs = x[:, None, :].expand(t, k, x.shape[1]).reshape(t * k, x.shape[1])
    hidden = _gated(args, project("gate_proj", xs), project("up_proj", xs))
    out = project("down_proj", hidden, bias=False)  # the down bias is added after the all-reduce (moe)
    mixed = out.view(t, k, -1) * weights[:, :, None]
    return mixed.sum(dim=1).to(x.dtype)


def dense_experts(args, params, e, x, weights, index) -> torch.Tensor:
    """Every expert on every token, summed with the routing weights (zero for experts a token did not pick)."""

    def project(name: str, inputs: torch.Tensor) -> torch.Tensor:  # inputs [E or 1, T, in] -> [E, T, out]
        out = torch.matmul(inputs, params[e + name].transpose(1, 2))
        bias = params.get(e + name + "_bias")
        return out if bias is None else out + bias[:, None, :]

    hidden = _gated(args, project("gate_proj", x[None]), project("up_proj", x[None]))
    out = torch.matmul(hidden, params[e + "down_proj"].transpose(1, 2))  # [E, T, hidden], no bias here
    dense_weights = _dense_weights(weights, index, args.num_experts)  # [T, E]
    mixed = out * dense_weights.t()[:, :, None]
    return mixed.sum(dim=0).to(x.dtype)


def _dense_weights(weights: torch.Tensor, index: torch.Tensor, experts: int) -> torch.Tensor:
    """[T, k] weights of experts `index` -> [T, E], zero elsewhere (a comparison, no scatter: compiles anywhere)."""
    ids = torch.arange(experts, dtype=torch.int32, device=index.device)
    picked = index[:, :, None] == ids  # [T, k, E]
    return (picked.to(weights.dtype) * weights[:, :, None]).sum(dim=1)


def _mix(weights: torch.Tensor, index: torch.Tensor, per_expert: torch.Tensor, experts: int) -> torch.Tensor:
    """sum_k weights[t, k] * per_expert[index[t, k]]: [T, hidden]."""
    return _dense_weights(weights, index, experts) @ per_expert.to(weights.dtype)


def _gated(args: ModelArgs, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if args.swiglu_limit is None:
        return activation(gate, args.hidden_act) * up
    # gpt-oss: clamped gate and up, gate * sigmoid(alpha * gate) * (up + 1)
    limit = args.swiglu_limit
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(gate * args.swiglu_alpha) * (up + 1)
