"""LoRA slots: a batch mixing the base model and three PEFT adapters gives each row the greedy tokens of
transformers + peft with its adapter, in every graph kind; bad adapters are refused with what to change."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from support.references import hf_greedy

from optimum_neuron_plugin import NeuronConfig
from optimum_neuron_plugin.errors import InputError
from optimum_neuron_plugin.graphs import graph_specs

from .helpers import CHUNK, CHUNKED_LOGITS_LIGHT, LIGHT_BUCKETS, SEQUENCE_LENGTH, prompt

peft = pytest.importorskip("peft")

RANK = 8
SHAPE = dict(
    batch_size=4, sequence_length=SEQUENCE_LENGTH, prefill_chunk_size=CHUNK, on_device_sampling=False,
    speculative_tokens=2, max_loras=3, max_lora_rank=RANK, **LIGHT_BUCKETS,
    lora_target_modules=("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),  # no k_proj slots
)  # fmt: skip
# (name, rank, alpha, rsLoRA, targets): every projection with slots, rsLoRA at the export's rank, a subset at a
# small rank.
ADAPTERS = [
    ("all", 4, 8, False, ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    ("rslora", RANK, 16, True, ["q_proj", "v_proj", "down_proj"]),
    ("small", 2, 4, False, ["o_proj", "up_proj"]),
]
NEW_TOKENS = 6


def make_adapter(hf, directory, seed: int, rank: int, alpha: int, rslora: bool, targets: list[str]):
    """A random-weight PEFT adapter of `hf` saved in `directory`; returns the peft model (the reference)."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, use_rslora=rslora, target_modules=targets, init_lora_weights=False
    )
    model = peft.get_peft_model(copy.deepcopy(hf), config)
    with torch.no_grad():  # B is small and random: each adapter changes the greedy tokens, never blows them up
        for name, tensor in model.named_parameters():
            if "lora_" in name:
                tensor.copy_(torch.randn_like(tensor) * 0.3)
    model.save_pretrained(directory)
    return model.eval()


@pytest.fixture(scope="module")
def lora(zoo, tmp_path_factory):
    artifact = zoo.artifact("llama", **SHAPE)
    root = tmp_path_factory.mktemp("adapters")
    references = {}
    for seed, (name, rank, alpha, rslora, targets) in enumerate(ADAPTERS):
        references[name] = make_adapter(artifact.hf, root / name, seed, rank, alpha, rslora, targets)
        artifact.model.load_adapter(name, root / name)
    yield artifact, root, references
    for name, _, _, _, _ in ADAPTERS:
        artifact.model.unload_adapter(name)


def test_graphs_take_an_adapter_index_only_with_slots():
    with_slots = graph_specs(NeuronConfig(**SHAPE), 512)
    assert all(spec.lora for spec in with_slots)
    without = graph_specs(NeuronConfig(**{k: v for k, v in SHAPE.items() if "lora" not in k}), 512)
    assert not any(spec.lora for spec in without)
    assert "max_loras" not in NeuronConfig().to_dict()  # an export without slots writes what it wrote before


def test_artifact_stores_no_slots(lora):
    artifact, _, _ = lora
    from safetensors.torch import load_file

    assert not [key for key in load_file(str(artifact.path / "model.safetensors")) if "lora" in key]
    saved = json.loads((artifact.path / "neuron_config.json").read_text())
    assert (saved["max_loras"], saved["max_lora_rank"]) == (3, RANK)


def test_mixed_batch_equals_peft_per_row(lora):
    """generate: chunked_prefill, then token_generation of 4 rows, each on its own adapter."""
    artifact, _, references = lora
    names = [None] + [name for name, *_ in ADAPTERS]
    prompts = [prompt(11, seed=20 + i) for i in range(4)]
    out = artifact.model.generate(torch.tensor(prompts), max_new_tokens=NEW_TOKENS, eos_token_id=[], adapters=names)
    for row, name in enumerate(names):
        reference = artifact.hf if name is None else references[name]
        assert out[row, 11:].tolist() == hf_greedy(reference, prompts[row], NEW_TOKENS), name


def test_adapters_change_the_tokens(lora):
    """The references differ: a slot read as the base model (or another slot) would fail the per-row test."""
    artifact, _, references = lora
    tokens = prompt(11, seed=20)
    outputs = {name: tuple(hf_greedy(ref, tokens, NEW_TOKENS)) for name, ref in references.items()}
    outputs[None] = tuple(hf_greedy(artifact.hf, tokens, NEW_TOKENS))
    assert len(set(outputs.values())) == len(outputs)


def test_chunk_and_decode_and_verify_per_row(lora):
    """A prompt on adapter `all` prefilled in chunk_and_decode calls next to decode rows on `rslora` and the base
    model, then a verify call of the three rows: every logit row is its own reference's."""
    artifact, _, references = lora
    model = artifact.model
    runs = {0: (None, prompt(9, seed=31)), 1: ("rslora", prompt(10, seed=32)), 2: ("all", prompt(20, seed=33))}
    for seq_id, (name, _) in runs.items():
        model.set_adapter(seq_id, name)
    try:
        for seq_id in (0, 1):
            model.prefill(seq_id, runs[seq_id][1])
        seqs = {seq_id: list(tokens) for seq_id, (_, tokens) in runs.items()}
        nexts = {s: int(_reference(artifact, references, runs[s][0], seqs[s]).argmax()) for s in (0, 1)}
        logits, decoded = model.prefill_and_decode(
            2, seqs[2], 0, [0, 1], [nexts[0], nexts[1]], [len(seqs[0]), len(seqs[1])]
        )
        for seq_id in (0, 1):
            seqs[seq_id].append(nexts[seq_id])
            expected = _reference(artifact, references, runs[seq_id][0], seqs[seq_id])
            torch.testing.assert_close(decoded.logits[seq_id], expected, atol=1e-3, rtol=0)
        torch.testing.assert_close(logits, _reference(artifact, references, "all", seqs[2]), atol=1e-3, rtol=0)
        drafts = {s: [int(_reference(artifact, references, runs[s][0], seqs[s]).argmax()), 7, 9] for s in runs}
        verified = model.verify(list(runs), [drafts[s] for s in runs], [len(seqs[s]) for s in runs])
        for row, seq_id in enumerate(runs):
            full = seqs[seq_id] + drafts[seq_id]
            reference = references.get(runs[seq_id][0], artifact.hf)
            with torch.no_grad():
                want = reference(torch.tensor([full])).logits[0, len(seqs[seq_id]) :].float()
            torch.testing.assert_close(verified[row], want, atol=1e-3, rtol=0)
    finally:
        for seq_id in runs:
            model.set_adapter(seq_id, None)


def _reference(artifact, references, name, tokens) -> torch.Tensor:
    model = artifact.hf if name is None else references[name]
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1].float()


def _write_adapter(hf, directory, **config):
    defaults = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft.get_peft_model(copy.deepcopy(hf), peft.LoraConfig(**(defaults | config))).save_pretrained(directory)
    return directory


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(r=16), "rank 16 exceeds this export's max_lora_rank 8: export again with --max-lora-rank 16"),
        (dict(use_dora=True), "DoRA is not supported by LoRA slots"),
        (
            dict(target_modules=["q_proj", "k_proj"]),
            "targets k_proj of layer 0, this export holds LoRA slots for q_proj, v_proj, o_proj, gate_proj, up_proj, "
            "down_proj: export again with --lora-target-modules including k_proj",
        ),
    ],
)
def test_adapter_config_checks(lora, tmp_path, change, message):
    artifact, _, _ = lora
    model = artifact.model
    path = _write_adapter(artifact.hf, tmp_path / "bad", **change)
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        model.load_adapter("bad", path)
    assert "bad" not in model.adapters


def test_adapter_of_another_base_model_is_refused(lora, tmp_path):
    artifact, _, _ = lora
    from transformers import LlamaConfig, LlamaForCausalLM

    config = copy.deepcopy(artifact.hf.config)
    other = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "hidden_size": 32, "num_hidden_layers": 2}))
    path = _write_adapter(other, tmp_path / "other")
    with pytest.raises(InputError, match="trained for another base model"):
        artifact.model.load_adapter("other", path)
    deeper = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 3}))
    with pytest.raises(InputError, match="targets layer 2, this model has 2 layers"):
        artifact.model.load_adapter("deeper", _write_adapter(deeper, tmp_path / "deeper"))


def test_load_errors(lora, tmp_path):
    artifact, root, _ = lora
    model = artifact.model
    with pytest.raises(InputError, match="no such directory on this host; give the path of a PEFT LoRA adapter"):
        model.load_adapter("missing", tmp_path / "nowhere")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="not a directory; give a PEFT LoRA adapter directory"):
        model.load_adapter("file", tmp_path / "file")
    with pytest.raises(InputError, match="an adapter named 'all' is already loaded"):
        model.load_adapter("all", root / "all")
    with pytest.raises(InputError, match="all 3 LoRA slots hold adapters .*export again with a larger --max-loras"):
        model.load_adapter("fourth", root / "small")
    with pytest.raises(InputError, match="adapter 'nope' is not loaded"):
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, adapters=["nope"])
    model.set_adapter(1, "small")
    try:
        with pytest.raises(InputError, match=r"in use by sequence\(s\) \[1\]"):
            model.unload_adapter("small")
    finally:
        model.set_adapter(1, None)
    assert set(model.adapters) == {"all", "rslora", "small"}


def test_unload_and_reload_is_a_copy(lora):
    """Unloading zeroes the slot (the base model's tokens come back); loading again into it restores the adapter."""
    artifact, root, references = lora
    model = artifact.model
    tokens = prompt(11, seed=40)
    slot = model.unload_adapter("small")
    stacks = [t for n, t in model.params.items() if n.endswith(".lora_B")]
    assert all(not stack[slot].any() for stack in stacks)
    assert model.load_adapter("small", root / "small", slot=slot) == slot
    out = model.generate(torch.tensor([tokens]), max_new_tokens=NEW_TOKENS, eos_token_id=[], adapters=["small"])
    assert out[0, 11:].tolist() == hf_greedy(references["small"], tokens, NEW_TOKENS)


def test_export_without_slots_refuses_adapters(zoo, tmp_path):
    artifact = zoo.artifact("llama", **CHUNKED_LOGITS_LIGHT)  # shared with other modules
    with pytest.raises(InputError, match="no LoRA slots: export it again with --max-loras N --max-lora-rank R"):
        artifact.model.load_adapter("x", tmp_path)


def test_export_flags_build_the_slots():
    from exporter.cli import build_parser, request_from_args

    base = ["--model", "m", "--backend", "cpu", "--batch-size", "2", "--sequence-length", "64"]
    flags = [*base, "--max-loras", "4", "--max-lora-rank", "16"]
    config = request_from_args(build_parser().parse_args([*flags, "out"])).neuron_config
    assert (config.max_loras, config.max_lora_rank, config.lora_target_modules[0]) == (4, 16, "q_proj")
    narrow = request_from_args(build_parser().parse_args([*flags, "--lora-target-modules", "v_proj,q_proj", "out"]))
    assert narrow.neuron_config.lora_target_modules == ("q_proj", "v_proj")
    with pytest.raises(ValueError, match="max_lora_rank=0 is not allowed: must be set together with max_loras"):
        request_from_args(build_parser().parse_args([*base, "--max-loras", "2", "out"]))


TP_SHAPE = dict(
    batch_size=2, sequence_length=SEQUENCE_LENGTH, prefill_chunk_size=CHUNK, on_device_sampling=False,
    context_buckets=(64,), prefill_buckets=(0, 64), decode_batch_sizes=(2,), max_loras=2, max_lora_rank=RANK,
)  # fmt: skip
TP_ADAPTERS = ("all", "rslora")  # every projection (A and B sharded both ways), and a subset


def tp_worker(rank: int, path, adapters, prompts, out) -> None:
    from optimum_neuron_plugin import NeuronModelForCausalLM

    model = NeuronModelForCausalLM.from_pretrained(path)
    for name in TP_ADAPTERS:
        model.load_adapter(name, adapters / name)
    tokens = model.generate(torch.tensor(prompts), max_new_tokens=NEW_TOKENS, eos_token_id=[], adapters=TP_ADAPTERS)
    torch.save(tokens[:, len(prompts[0]) :].tolist(), out / f"rank{rank}.pt")


def test_tensor_parallel_slots_equal_peft(lora, zoo, tmp_path):
    """tp 2: each rank holds its shard of every slot (B by a column-parallel projection's rows, A by a row-parallel
    one's columns): both rows, each on its adapter, give peft's greedy tokens on both ranks."""
    from support.tensor_parallel import run_ranks
    from support.tiny_models import export

    artifact, root, references = lora
    path = export(zoo.tiny("llama").path, tmp_path / "tp2", tp_degree=2, **TP_SHAPE)
    prompts = [prompt(11, seed=50), prompt(11, seed=51)]
    run_ranks(tp_worker, 2, path, root, prompts, tmp_path, start_method="fork")
    want = [hf_greedy(references[name], tokens, NEW_TOKENS) for name, tokens in zip(TP_ADAPTERS, prompts, strict=True)]
    assert [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)] == [want, want]


def test_the_memory_plan_counts_the_slots():
    """docs/lora.md's figure: SmolLM2-135M, rank 16, bf16, every projection: 9,768,960 bytes per slot at TP 1; at
    TP 3 a rank holds A of o/down and B of q/k/v/gate/up split 3 ways."""
    from optimum_neuron_plugin.models.args import ModelArgs
    from optimum_neuron_plugin.sizing import lora_bytes, plan_memory

    smollm2 = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
        max_position_embeddings=8192, tie_word_embeddings=True,
    )  # fmt: skip
    args = ModelArgs.from_hf_config(smollm2)
    nc = NeuronConfig(batch_size=4, sequence_length=2048, torch_dtype="bfloat16", max_loras=4, max_lora_rank=16)
    assert lora_bytes(args, nc) == 5 * 9_768_960
    column = 5 * 576 + (576 + 2 * 192 + 2 * 1536) // 3  # q, k, v, gate, up: A [hidden, R] whole, B's outputs / 3
    row = 2 * 576 + (576 + 1536) // 3  # o, down: B [R, hidden] whole, A's inputs / 3
    per_layer = column + row
    assert lora_bytes(args, NeuronConfig(**{**nc.to_dict(), "tp_degree": 3})) == 5 * 30 * per_layer * 16 * 2
    plan = plan_memory(args, nc, None)
    assert plan.lora == lora_bytes(args, nc) and any("LoRA slots" in line for line in plan.lines())
    without = plan_memory(args, NeuronConfig(batch_size=4, sequence_length=2048, torch_dtype="bfloat16"), None)
    assert without.lora == 0 and plan.total - without.total == plan.lora
