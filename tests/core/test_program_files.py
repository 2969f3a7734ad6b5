"""The CPU backend's program files: saved without torch's canonical-form self-test, byte for byte what torch's own
save writes; read into the same schema objects as torch's reader, and loaded back to the same logits."""

from __future__ import annotations

import json
import zipfile

import torch
from support.tiny_models import save_tiny
from torch._export.serde import schema, serialize

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.backends import cpu_serde
from optimum_neuron_plugin.backends.cpu_serde import load_program, planned_dict_to_dataclass, save_program
from optimum_neuron_plugin.backends.program_cache import CACHE_ENV

from .helpers import VOCAB


def _entries(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_a_saved_program_is_what_torch_saves(tmp_path, monkeypatch):
    traced: list[torch.export.ExportedProgram] = []
    export = torch.export.export

    def keep(*args, **kwargs):
        traced.append(export(*args, **kwargs))
        return traced[-1]

    monkeypatch.setattr(torch.export, "export", keep)
    monkeypatch.delenv(CACHE_ENV, raising=False)  # traced here, not copied from the session's compile cache
    source = save_tiny(tmp_path / "hf", "llama", seed=3, vocab_size=VOCAB)
    config = NeuronConfig(batch_size=1, sequence_length=16, prefill_chunk_size=0, context_buckets=(16,))
    NeuronModelForCausalLM.export(source, config)
    assert len(traced) == 2  # context_encoding and token_generation
    program = traced[-1]
    (tmp_path / "ours").mkdir(), (tmp_path / "torch").mkdir()
    save_program(program, tmp_path / "ours" / "graph.pt2")
    torch.export.save(program, str(tmp_path / "torch" / "graph.pt2"))  # example inputs already dropped by ours
    ours, theirs = _entries(tmp_path / "ours" / "graph.pt2"), _entries(tmp_path / "torch" / "graph.pt2")
    assert ours.keys() == theirs.keys() and len(ours) > 2
    assert ours == theirs
    loaded = load_program(tmp_path / "ours" / "graph.pt2")
    program_json = json.loads(next(data for name, data in ours.items() if name.endswith("models/model.json")))
    planned = planned_dict_to_dataclass(schema.ExportedProgram, program_json)
    assert cpu_serde.torch_dict_to_dataclass not in (None, planned_dict_to_dataclass)
    assert planned == cpu_serde.torch_dict_to_dataclass(schema.ExportedProgram, program_json)
    assert serialize._dataclass_to_dict(planned) == program_json
    assert sum(1 for n in loaded.graph.nodes if n.op == "call_function") > 50
