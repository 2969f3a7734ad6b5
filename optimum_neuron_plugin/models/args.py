"""ModelArgs: the architecture facts the graphs need, read from a Hugging Face config."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


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

    @classmethod
    def from_hf_config(cls, config: dict) -> ModelArgs:
        architecture = (config.get("architectures") or [_BY_MODEL_TYPE.get(config.get("model_type"), "")])[0]
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {architecture or '(none)'!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        heads = config["num_attention_heads"]
        is_qwen2 = architecture == "Qwen2ForCausalLM"
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
            rope_scaling=_rope_scaling(config),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or bool(config.get("attention_bias", False)),
            o_bias=not is_qwen2 and bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=architecture == "Qwen3ForCausalLM",
            sliding_window=_sliding_window(config),
            eos_token_ids=_as_list(config.get("eos_token_id")),
        )

    def to_dict(self) -> dict:
        return asdict(self)


def _rope_theta(config: dict) -> float:
    params = config.get("rope_parameters") or {}
    return float(params.get("rope_theta") or config.get("rope_theta") or 10000.0)


def _rope_scaling(config: dict) -> dict | None:
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or None
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind != "llama3":
        raise UnsupportedModelError(f"rope scaling {kind!r} is not supported; supported: default, llama3")
    return dict(scaling)


def _sliding_window(config: dict) -> int | None:
    if config.get("use_sliding_window") is False:
        return None
    window = config.get("sliding_window")
    return int(window) if window else None


def _as_list(value: object) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
