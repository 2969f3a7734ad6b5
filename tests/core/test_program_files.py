"""The CPU backend's program files: saved without torch's canonical-form self-test, byte for byte what torch's own
save writes plus the graph record; the module rebuilt from the record is the program's own module; a file without a
record is read into the same schema objects as torch's reader."""

from __future__ import annotations

import json
import zipfile

import torch
from support.tiny_models import save_tiny
from torch._export.serde import serialize

from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM, torch_compat
from optimum_neuron_plugin.backends.cpu_graph_record import RECORD_FILE, rebuild
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
    (record_name,) = [name for name in ours if name.endswith(f"/extra/{RECORD_FILE}")]
    assert ours.keys() - theirs.keys() == {record_name} and len(theirs) > 2
    # Every entry of torch's file, byte for byte, but the archive's id (derived from every entry, the record's too).
    same = [name for name in theirs if not name.endswith(".data/serialization_id")]
    assert len(same) == len(theirs) - 1 and {n: ours[n] for n in same} == {n: theirs[n] for n in same}

    # The module rebuilt from the record is torch's module of the program, node for node, and checks its inputs.
    rebuilt = load_program(tmp_path / "ours" / "graph.pt2")
    own = torch.export.load(str(tmp_path / "torch" / "graph.pt2")).module()
    assert rebuilt.code == own.code and sum(1 for n in rebuilt.graph.nodes if n.op == "call_function") > 50
    assert [n.name for n in rebuilt.graph.nodes] == [n.name for n in own.graph.nodes]

    def inputs(module):
        return [(n.meta["val"].shape, n.meta["val"].dtype) for n in module.graph.find_nodes(op="placeholder")]

    assert inputs(rebuilt) == inputs(own)
    text = ours[record_name].decode()
    assert rebuild(text.replace(f'"torch":"{torch.__version__}"', '"torch":"0.0"')) is None  # another torch's

    # Without a record (torch's own file), torch's reader runs with the planned dataclass conversion.
    loaded = load_program(tmp_path / "torch" / "graph.pt2")
    assert loaded.code == own.code
    program_json = json.loads(next(data for name, data in ours.items() if name.endswith("models/model.json")))
    exported_program = torch_compat.export_schema().ExportedProgram
    planned = planned_dict_to_dataclass(exported_program, program_json)
    assert torch_compat.export_json_reader() is not planned_dict_to_dataclass  # torch's, once the load is done
    assert planned == torch_compat.export_json_reader()(exported_program, program_json)
    assert serialize._dataclass_to_dict(planned) == program_json
