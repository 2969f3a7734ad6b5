"""ModelArgs: the architecture facts the graphs need, read from a Hugging Face config."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma3ForCausalLM",
    "GraniteForCausalLM",
    "Phi3ForCausalLM",
    "SmolLM3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
    "GptOssForCausalLM",
)


_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
SLIDING, FULL = "sliding_attention", "full_attention"
_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
# How a MoE router turns its logits into k routing weights (models/moe.py).
ROUTERS = ("softmax_topk", "topk_softmax")


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class ModelArgs:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    # Per-layer attention kind (SLIDING or FULL); empty: every layer slides when sliding_window is set.
    layer_types: tuple[str, ...] = ()
    sliding_rope_theta: float | None = None  # the sliding layers' own rope base (Gemma 3's rope_local_base_freq)
    hidden_act: str = "silu"
    norm_offset: float = 0.0  # RMSNorm scales by (offset + w), in fp32 (Gemma: 1)
    embed_scale: float = 1.0  # the embedding lookup is multiplied by it (Gemma: sqrt(hidden_size))
    attention_scale: float | None = None  # softmax scale; None: head_dim ** -0.5
    sandwich_norms: bool = False  # norms after attention and the MLP too (Gemma: pre/post feedforward norms)
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    residual_multiplier: float = 1.0  # each block's output is scaled before the residual add (Granite)
    logits_scaling: float = 1.0  # logits are divided by it (Granite)
    rope_layers: tuple[bool, ...] = ()  # per layer, whether it rotates q/k (SmolLM3: no rope on every 4th); empty: all
    # Mixture of experts (models/moe.py); num_experts 0: every layer has the dense MLP.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's MLP size
    moe_layers: tuple[bool, ...] = ()  # per layer, whether its MLP is the MoE block; empty: every layer's is
    router: str = "softmax_topk"  # one of ROUTERS
    norm_topk_prob: bool = False  # softmax_topk: renormalise the k weights to sum to 1
    router_weights_fp32: bool = False  # the routing weights stay fp32 (Mixtral) instead of the model dtype
    router_bias: bool = False  # the router's logits have a bias (gpt-oss)
    expert_bias: bool = False  # the experts' projections have biases (gpt-oss)
    swiglu_limit: float | None = None  # gpt-oss's clamped SwiGLU: gate and up clamped to the limit
    swiglu_alpha: float = 1.702  # ... and gate * sigmoid(alpha * gate) * (up + 1)
    attention_sinks: bool = False  # a learned per-head logit joins each softmax with a zero value (gpt-oss)

    def is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` attends only the last sliding_window positions."""
        if not self.sliding_window:
            return False
        return self.layer_types[layer] == SLIDING if self.layer_types else True

    def uses_rope(self, layer: int) -> bool:
        return self.rope_layers[layer] if self.rope_layers else True

    def is_moe(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is the mixture-of-experts block."""
        if not self.num_experts:
            return False
        return self.moe_layers[layer] if self.moe_layers else True

    @property
    def has_sliding_layers(self) -> bool:
        return any(self.is_sliding(i) for i in range(self.num_hidden_layers))

    @property
    def every_layer_slides(self) -> bool:
        return all(self.is_sliding(i) for i in range(self.num_hidden_layers))

    @classmethod
    def from_hf_config(cls, config: dict) -> ModelArgs:
        architecture = (config.get("architectures") or [_BY_MODEL_TYPE.get(config.get("model_type"), "")])[0]
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {architecture or '(none)'!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        heads = config["num_attention_heads"]
        is_qwen2 = architecture == "Qwen2ForCausalLM"
        family = _FAMILIES[architecture](config) if architecture in _FAMILIES else {}
        return cls(
            architecture=architecture,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            max_position_embeddings=config["max_position_embeddings"],
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(config),
            rope_scaling=_rope_scaling(_rope_params(config)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or bool(config.get("attention_bias", False)),
            o_bias=not is_qwen2 and bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=architecture in ("Qwen3ForCausalLM", "Gemma3ForCausalLM", "Qwen3MoeForCausalLM"),
            sliding_window=_sliding_window(config),
            eos_token_ids=_as_list(config.get("eos_token_id")),
            layer_types=tuple(config.get("layer_types") or ()),
            **family,
        )

    def to_dict(self) -> dict:
        return asdict(self)


def _gemma3(config: dict) -> dict:
    if config.get("attn_logit_softcapping"):
        raise UnsupportedModelError("attention logit softcapping is not supported (Gemma 3 models do not use it)")
    if config.get("use_bidirectional_attention"):
        raise UnsupportedModelError("bidirectional attention is not supported: only causal language models are")
    hidden_act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if hidden_act not in _ACTIVATIONS:
        raise UnsupportedModelError(f"activation {hidden_act!r} is not supported; supported: {', '.join(_ACTIVATIONS)}")
    sliding = _rope_params(config, SLIDING)
    if _rope_scaling(sliding):
        raise UnsupportedModelError("rope scaling on the sliding-window layers is not supported (only on full layers)")
    return dict(
        sliding_rope_theta=float(sliding.get("rope_theta") or config.get("rope_local_base_freq") or 10000.0),
        hidden_act=hidden_act,
        norm_offset=1.0,
        embed_scale=config["hidden_size"] ** 0.5,
        attention_scale=config["query_pre_attn_scalar"] ** -0.5,
        sandwich_norms=True,
        final_logit_softcapping=config.get("final_logit_softcapping") or None,
    )


def _granite(config: dict) -> dict:
    return dict(
        embed_scale=float(config.get("embedding_multiplier", 1.0)),
        attention_scale=float(config["attention_multiplier"]),
        residual_multiplier=float(config.get("residual_multiplier", 1.0)),
        logits_scaling=float(config.get("logits_scaling", 1.0)),
    )


def _phi3(config: dict) -> dict:
    """Phi-3's fused qkv_proj and gate_up_proj are split on load (models/checkpoint.py): the decoder is Llama's."""
    rope = _rope_params(config)
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError("a partial rotary factor is not supported (rope on every head dimension only)")
    return {}


def _smollm3(config: dict) -> dict:
    return dict(rope_layers=tuple(bool(x) for x in config.get("no_rope_layers") or ()))


def _qwen3_moe(config: dict) -> dict:
    layers, step = config["num_hidden_layers"], config.get("decoder_sparse_step") or 1
    dense = set(config.get("mlp_only_layers") or ())
    experts = int(config.get("num_local_experts") or config.get("num_experts") or 0)
    return dict(
        num_experts=experts,
        num_experts_per_tok=int(config["num_experts_per_tok"]),
        moe_intermediate_size=int(config["moe_intermediate_size"]),
        moe_layers=tuple(experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(layers)),
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
    )


def _mixtral(config: dict) -> dict:
    return dict(
        num_experts=int(config["num_local_experts"]),
        num_experts_per_tok=int(config["num_experts_per_tok"]),
        moe_intermediate_size=int(config["intermediate_size"]),
        norm_topk_prob=True,
        router_weights_fp32=True,
    )


def _gpt_oss(config: dict) -> dict:
    return dict(
        num_experts=int(config["num_local_experts"]),
        num_experts_per_tok=int(config["num_experts_per_tok"]),
        moe_intermediate_size=int(config["intermediate_size"]),
        router="topk_softmax",
        router_bias=True,
        expert_bias=True,
        swiglu_limit=float(config["swiglu_limit"]),
        swiglu_alpha=float(config["swiglu_alpha"]),
        attention_sinks=True,
    )


_FAMILIES = {
    "Gemma3ForCausalLM": _gemma3,
    "GraniteForCausalLM": _granite,
    "Phi3ForCausalLM": _phi3,
    "SmolLM3ForCausalLM": _smollm3,
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "MixtralForCausalLM": _mixtral,
    "GptOssForCausalLM": _gpt_oss,
}


def _rope_params(config: dict, layer_type: str = FULL) -> dict:
    """The rope parameters of one kind of layer: HF's per-layer-type dict (Gemma 3) or the model-wide one."""
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if isinstance(params.get(layer_type), dict) or layer_type in params:
        return params.get(layer_type) or {}
    return params


def _rope_theta(config: dict) -> float:
    params = _rope_params(config)
    return float(params.get("rope_theta") or config.get("rope_theta") or 10000.0)


_ROPE_SCALINGS = ("default", "llama3", "linear", "yarn")


def _rope_scaling(scaling: dict) -> dict | None:
    """The rope parameters when they rescale the frequencies, None for the default rope."""
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind not in _ROPE_SCALINGS:
        raise UnsupportedModelError(f"rope scaling {kind!r} is not supported; supported: {', '.join(_ROPE_SCALINGS)}")
    return dict(scaling, rope_type=kind)


def _sliding_window(config: dict) -> int | None:
    if config.get("use_sliding_window") is False:
        return None
    window = config.get("sliding_window")
    return int(window) if window else None


def _as_list(value: object) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
