"""FP8 weights: the three checkpoint formats read as vLLM dequantizes them, `--quantize fp8` of an fp32 checkpoint,
the graphs computing exactly what HF computes on the dequantized weights, trn2's range, refused layouts."""

from __future__ import annotations

import json

import pytest
import torch
from support.fp8_checkpoints import BLOCK_SHAPE, PROJECTIONS, dequantized_model, save_fp8
from support.tiny_models import quick_first, tiny_model

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.errors import ExportError
from optimum_neuron_plugin.models import fp8
from optimum_neuron_plugin.runtime.artifact_io import to_params
from optimum_neuron_plugin.sources import load_source

from .helpers import CHUNKED_LOGITS_LIGHT, SEEDS, VOCAB, prompt

# The exports here are called through prefill only: the light prefill buckets (prompts of 19-27 tokens run chunks in
# buckets 0, 16 and 64) and the fewest other graphs an export has (one context bucket, one decode row count, no copy).
SHAPE = dict(CHUNKED_LOGITS_LIGHT, batch_size=2, context_buckets=(64,), decode_batch_sizes=(2,), prefix_copy=False)


def vllm_dequantized(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """vLLM's dequantization of one linear's stored tensors (scaled_dequantize broadcasts each scale over its group)."""
    scale = tensors.get("weight_scale_inv", tensors.get("weight_scale"))
    # Imported here, not at collection: importing vLLM resolves its platform for the whole process, which must happen
    # after tests/vllm/conftest.py sets ONP_BACKEND=cpu.
    from vllm.model_executor.layers.quantization.utils.quant_utils import scaled_dequantize

    return scaled_dequantize(tensors["weight"], scale, out_dtype=torch.float32)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """kind -> (the fp32 HF model, its FP8 checkpoint directory), built on first use."""
    root, built = tmp_path_factory.mktemp("fp8-checkpoints"), {}

    def get(kind: str):
        if kind not in built:
            hf = tiny_model("llama", seed=SEEDS["llama"], vocab_size=VOCAB, **(BLOCK_SHAPE if kind == "fp8" else {}))
            built[kind] = hf, save_fp8(root / kind, hf, kind)
        return built[kind]

    return get


@pytest.mark.parametrize("kind", ["fp8", "compressed-tensors", "compressed-tensors-tensor", "modelopt"])
def test_each_format_loads_as_vllm_dequantizes_it(checkpoints, kind):
    from safetensors.torch import load_file

    hf, directory = checkpoints(kind)
    stored = load_file(str(directory / "model.safetensors"))
    state = load_source(directory).state_dict
    names = [n for n in hf.state_dict() if n.endswith(".weight") and n.rsplit(".", 2)[-2] in PROJECTIONS]
    assert len(names) == 7 * hf.config.num_hidden_layers  # the tiny Llama: no fused projection
    for name in names:
        prefix = name.removesuffix("weight")
        assert state[name].dtype == torch.float8_e4m3fn and torch.equal(
            state[name].view(torch.uint8), stored[name].view(torch.uint8)
        )
        expected = vllm_dequantized({k.removeprefix(prefix): v for k, v in stored.items() if k.startswith(prefix)})
        assert torch.equal(fp8.dequantize(state[name], state[name + "_scale"]), expected), name
    assert not any(n.endswith("input_scale") for n in state)
    has_kv_scales = kind != "fp8"
    assert ("model.layers.1.self_attn.v_scale" in state) == has_kv_scales
    if has_kv_scales:
        assert state["model.layers.1.self_attn.v_scale"].shape == () and float(
            state["model.layers.1.self_attn.v_scale"]
        ) == pytest.approx(0.009)


@pytest.mark.parametrize(
    "kind", quick_first(["fp8", "compressed-tensors", "modelopt"], quick=("fp8", "compressed-tensors"))
)
def test_fp8_graphs_compute_what_hf_computes_on_the_dequantized_weights(checkpoints, tmp_path, kind):
    hf, directory = checkpoints(kind)
    NeuronModelForCausalLM.export(directory, NeuronConfig(**SHAPE)).save_pretrained(tmp_path / "artifact")
    model = NeuronModelForCausalLM.from_pretrained(tmp_path / "artifact")
    assert model.neuron_config.quantization == "fp8"
    assert json.loads((tmp_path / "artifact" / "neuron_config.json").read_text())["quantization"] == "fp8"
    assert model.params["model.layers.0.mlp.down_proj.weight"].dtype == torch.float8_e4m3fn
    assert model.params["model.embed_tokens.weight"].dtype == torch.float32  # the rule: embeddings stay unquantized
    reference = dequantized_model(hf, directory, vllm_dequantized)
    tokens = prompt(21, seed=3)
    logits = model.prefill(0, tokens)
    with torch.no_grad():
        expected, original = reference(torch.tensor([tokens])).logits[0, -1], hf(torch.tensor([tokens])).logits[0, -1]
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-5)  # the same math: fp32 rounding apart
    # E4M3 keeps 3 mantissa bits: the weights move by up to 1/16 of themselves, the tiny model's logits by < 0.5.
    assert 0.01 < (logits - original).abs().max() < 0.5


def test_quantize_fp8_quantizes_each_output_channel(zoo, tmp_path):
    tiny = zoo.tiny("llama")
    config = NeuronConfig(quantization="fp8", **SHAPE)
    NeuronModelForCausalLM.export(tiny.path, config).save_pretrained(tmp_path / "artifact")
    model = NeuronModelForCausalLM.from_pretrained(tmp_path / "artifact")
    weight, scale = (model.params["model.layers.1.self_attn.q_proj.weight" + s] for s in ("", "_scale"))
    original = tiny.hf.state_dict()["model.layers.1.self_attn.q_proj.weight"]
    assert weight.dtype == torch.float8_e4m3fn and scale.shape == (original.shape[0],)
    torch.testing.assert_close(scale, original.abs().amax(dim=1) / 448.0)  # symmetric, per output channel, OCP range
    assert torch.equal(weight.float().abs().amax(dim=1), torch.full_like(scale, 448.0))

    reference = dequantized_model(
        tiny.hf, tmp_path / "artifact", lambda t: fp8.dequantize(t["weight"], t["weight_scale"])
    )
    tokens = prompt(19, seed=5)
    logits = model.prefill(1, tokens)
    with torch.no_grad():
        expected, exact = reference(torch.tensor([tokens])).logits[0, -1], tiny.hf(torch.tensor([tokens])).logits[0, -1]
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-5)
    assert (logits - exact).abs().max() < 0.5


def test_trn2_rescales_weights_above_240_and_never_makes_nan(checkpoints):
    hf, directory = checkpoints("compressed-tensors")
    state = load_source(directory).state_dict
    name = "model.layers.0.mlp.up_proj.weight"
    assert state[name].float().abs().max() == 448.0  # the checkpoint's range: OCP E4M3FN
    for target, largest in (("trn2", 240.0), ("trn3", 448.0), (None, 448.0)):
        config = NeuronConfig(quantization="fp8", target=target, **SHAPE)
        params = to_params(state, load_source(directory).args, torch.float32, config)
        values = params[name].float()
        assert not values.isnan().any() and values.abs().max() == largest, target
        dequantized = fp8.dequantize(params[name], params[name + "_scale"])
        original = fp8.dequantize(state[name], state[name + "_scale"])
        # 240/448 of an E4M3 value is rounded again to 3 mantissa bits: within 1/16 of itself, or of the smallest
        # subnormal step (2^-9 of the scale) below E4M3's normal range.
        bound = original.abs() / 16 + params[name + "_scale"][:, None] * 2**-9
        assert ((dequantized - original).abs() <= bound).all(), target
        if target != "trn2":
            assert torch.equal(params[name].view(torch.uint8), state[name].view(torch.uint8))


def test_fit_range_touches_only_the_groups_above_the_range():
    weight = torch.tensor([[448.0, 1.0], [192.0, -3.0]]).to(fp8.FP8_DTYPE)
    fitted, scale = fp8.fit_range(weight, torch.tensor([0.5, 0.25]), 240.0)
    assert fitted.float().tolist() == [[240.0, 0.5625], [192.0, -3.0]]  # row 0 x 240/448, rounded; row 1 untouched
    assert scale.tolist() == pytest.approx([0.5 * 448 / 240, 0.25])


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (
            lambda cfg, t: t.update({"model.layers.0.mlp.up_proj.weight_scale": torch.ones(3, 5)}),
            "model.layers.0.mlp.up_proj.weight_scale of shape [3, 5]",
        ),
        (
            lambda cfg, t: t.pop("model.layers.1.self_attn.o_proj.weight_scale"),
            "FP8 tensor model.layers.1.self_attn.o_proj.weight has no weight_scale",
        ),
        (
            lambda cfg, t: t.update({"model.norm.weight": t["model.norm.weight"].to(torch.float8_e5m2)}),
            "tensor model.norm.weight: dtype torch.float8_e5m2",
        ),
        (
            lambda cfg, t: cfg["quantization_config"]["config_groups"]["group_0"]["weights"].update(type="int"),
            "config_groups.group_0.weights: int 8 bits",
        ),
    ],
    ids=["scale-shape", "no-scale", "e5m2", "int8"],
)
def test_a_layout_the_plugin_cannot_honour_is_refused_by_name(checkpoints, tmp_path, break_it, message):
    from safetensors.torch import load_file, save_file

    _, directory = checkpoints("compressed-tensors")
    config, tensors = (
        json.loads((directory / "config.json").read_text()),
        load_file(str(directory / "model.safetensors")),
    )
    break_it(config, tensors)
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ExportError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_source(tmp_path)


def test_tensor_parallel_shards_split_fp8_scales_with_their_rows_and_columns(checkpoints):
    from optimum_neuron_plugin.models import sharding

    for kind, degree in (("compressed-tensors", 2), ("fp8", 2), ("fp8", 4)):
        hf, directory = checkpoints(kind)
        source = load_source(directory)
        params = to_params(source.state_dict, source.args, torch.float32, NeuronConfig(quantization="fp8", **SHAPE))
        plan = sharding.layout_for(source.args, degree)
        if kind == "fp8" and degree == 4:  # 64 down_proj columns per rank: half a 128-column block
            with pytest.raises(
                sharding.ShardingError,
                match="model.layers.0.mlp.down_proj.weight_scale: its 128-column FP8 block scales",
            ):
                sharding.shard_params(params, source.args, plan, 1)
            continue
        shards = [sharding.shard_params(params, source.args, plan, rank) for rank in range(degree)]
        for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"):
            weight = f"model.layers.1.{name}.weight"
            full = fp8.dequantize(params[weight], params[weight + "_scale"])
            parts = [fp8.dequantize(s[weight], s[weight + "_scale"]) for s in shards]
            dim = 1 if name.endswith(("o_proj", "down_proj")) else 0  # row-parallel weights split their columns
            assert torch.equal(torch.cat(parts, dim=dim), full), (kind, name)


@pytest.mark.parametrize("name", quick_first(["phi3", "gemma3", "qwen3"], quick=("phi3",)))
def test_fp8_checkpoints_of_other_families(tmp_path, name):
    """Phi-3's fused qkv_proj / gate_up_proj (their per-channel scales split with their rows), Gemma 3's sliding
    window read and sandwich norms, Qwen3's q/k norms: an FP8 checkpoint's graphs compute HF's on its dequantized
    weights."""
    hf = tiny_model(name, seed=SEEDS[name], vocab_size=VOCAB)
    directory = save_fp8(tmp_path / "checkpoint", hf, "compressed-tensors")
    NeuronModelForCausalLM.export(directory, NeuronConfig(**SHAPE)).save_pretrained(tmp_path / "artifact")
    model = NeuronModelForCausalLM.from_pretrained(tmp_path / "artifact")
    assert model.params["model.layers.0.self_attn.k_proj.weight"].dtype == torch.float8_e4m3fn
    reference = dequantized_model(hf, directory, vllm_dequantized)
    tokens = prompt(27, seed=6)
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0, -1]
    torch.testing.assert_close(model.prefill(0, tokens), expected, atol=2e-5, rtol=1e-5)


def test_a_sharded_checkpoint_is_read_through_its_index(checkpoints, tmp_path):
    """Only the files model.safetensors.index.json names are read: a stray consolidated.safetensors (Mistral's releases
    ship one beside the shards, under other tensor names) is ignored."""
    from safetensors.torch import load_file, save_file

    _, directory = checkpoints("compressed-tensors")
    tensors = load_file(str(directory / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(tmp_path / file))
    weight_map = {n: file for file, part in shards.items() for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    save_file(
        {"layers.0.attention.wq.weight": torch.zeros(4, 4).to(fp8.FP8_DTYPE)},
        str(tmp_path / "consolidated.safetensors"),
    )
    state = load_source(tmp_path).state_dict
    reference = load_source(directory).state_dict
    assert state.keys() == reference.keys()
    assert all(
        torch.equal(state[n].view(torch.uint8), reference[n].view(torch.uint8)) for n in state if n.endswith("weight")
    )
