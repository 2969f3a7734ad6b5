"""Every entry of optimum_neuron_plugin/torch_compat.py, each on the installed torch: a torch release that renames or
drops a private name fails here, in the entry's own test. The AOTInductor entries compile C++ for minutes: they run in
tests/cli/test_export_inductor.py."""

from __future__ import annotations

import inspect
import json
import operator
import zipfile

import pytest
import torch

from optimum_neuron_plugin import torch_compat
from optimum_neuron_plugin.backends.cpu_graph_record import rebuild, record
from optimum_neuron_plugin.backends.cpu_serde import planned_dict_to_dataclass
from optimum_neuron_plugin.models.collectives import Collectives, export_world


class TreeProgram(torch.nn.Module):
    """Trees of tensors in and out, a constant, two ops: what the graph record must carry."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor([1.0, 2.0, 3.0]))

    def forward(self, inputs: dict[str, torch.Tensor], bias: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        product = inputs["a"] @ inputs["b"].T * self.scale
        return product + bias[0], product.sum(dim=-1)


def _inputs() -> tuple:
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 4, generator=generator), torch.randn(3, 4, generator=generator)
    return {"a": a, "b": b}, [torch.randn(3, generator=generator)]


@pytest.fixture(scope="module")
def program() -> torch.export.ExportedProgram:
    exported = torch.export.export(TreeProgram(), _inputs(), strict=False)
    exported.example_inputs = None  # as save_program saves it: its module then has no guard submodule
    return exported


@pytest.mark.parametrize("installed", ["2.13.0+cpu", "2.13.1", "2.14.0", "2.14.0a0+git1234"])
def test_a_torch_in_the_supported_range_passes(installed):
    assert torch_compat.check_torch_version(installed) == installed


@pytest.mark.parametrize("installed", ["2.12.1", "2.15.0", "3.0.0", "nightly"])
def test_a_torch_out_of_the_range_fails_naming_both_versions(installed):
    with pytest.raises(torch_compat.UnsupportedTorchError) as raised:
        torch_compat.check_torch_version(installed)
    message = str(raised.value)
    assert f"torch {installed} is installed" in message and "torch >= 2.13, < 2.15" in message


def test_the_installed_torch_is_supported():
    assert torch_compat.check_torch_version() == torch.__version__


def test_the_recorded_graph_module_replays_the_program(program):
    """lazy_graph_module, (use_)pytree_signature, (set_)module_tree_specs, flatten_by_spec, treespec text and
    op_overload_name, through the graph record that uses them all."""
    own = program.module()
    assert torch_compat.pytree_signature(own.graph) is not None
    rebuilt = rebuild(record(own))
    assert rebuilt is not None and rebuilt.code == own.code
    assert type(rebuilt) is not torch.fx.GraphModule and isinstance(rebuilt, torch.fx.GraphModule)  # the lazy one
    inputs = _inputs()
    for got, expected in zip(rebuilt(*inputs), TreeProgram()(*inputs), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    in_spec, _ = torch_compat.module_tree_specs(rebuilt)
    leaves = torch_compat.flatten_by_spec((list(inputs), {}), in_spec)
    assert [tuple(t.shape) for t in leaves] == [(2, 4), (3, 4), (3,)]


def test_a_graph_of_plain_code_has_no_pytree_signature():
    assert torch_compat.pytree_signature(torch.fx.symbolic_trace(torch.nn.ReLU()).graph) is None


def test_op_overload_names():
    assert torch_compat.op_overload_name(torch.ops.aten.add.Tensor) == "aten::add.Tensor"
    assert torch_compat.op_overload_name(operator.getitem) is None
    assert torch_compat.op_overload_name(torch.ops.aten.add) is None  # the packet, no overload chosen


def test_treespecs_round_trip_through_text(program):
    in_spec, _ = torch_compat.module_tree_specs(program.module())
    assert torch_compat.treespec_from_text(torch_compat.treespec_to_text(in_spec)) == in_spec


def test_a_program_saved_without_the_canonical_check_loads_with_the_planned_reader(program, tmp_path):
    path = tmp_path / "program.pt2"
    with torch_compat.export_save_without_canonical_check():
        torch.export.save(program, str(path))
    torch_reader = torch_compat.export_json_reader()
    with torch_compat.export_load_reading_json_with(planned_dict_to_dataclass):
        assert torch_compat.export_json_reader() is planned_dict_to_dataclass
        loaded = torch.export.load(str(path))
    assert torch_compat.export_json_reader() is torch_reader  # restored
    inputs = _inputs()
    for got, expected in zip(loaded.module()(*inputs), program.module()(*inputs), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # The planned reader builds what torch's builds from the same JSON.
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("models/model.json"))
        program_json = json.loads(archive.read(name))
    schema = torch_compat.export_schema()
    assert planned_dict_to_dataclass(schema.ExportedProgram, program_json) == torch_reader(
        schema.ExportedProgram, program_json
    )


def test_the_json_reader_is_restored_when_the_load_fails(program, tmp_path):
    torch.export.save(program, str(tmp_path / "program.pt2"))
    torch_reader = torch_compat.export_json_reader()

    def refuse(cls, data):
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"), torch_compat.export_load_reading_json_with(refuse):
        torch.export.load(str(tmp_path / "program.pt2"))
    assert torch_compat.export_json_reader() is torch_reader


def test_schema_types_resolve_and_unions_are_told_apart():
    schema = torch_compat.export_schema()
    assert torch_compat.resolve_export_schema_type("Graph") is schema.Graph
    assert torch_compat.is_export_schema_union(schema.Argument)
    assert not torch_compat.is_export_schema_union(schema.Graph) and not torch_compat.is_export_schema_union(int)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="a torch build without oneDNN")
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_packed_linear_is_f_linear(with_bias):
    generator = torch.Generator().manual_seed(1)
    x, weight = torch.randn(5, 64, generator=generator), torch.randn(48, 64, generator=generator)
    bias = torch.randn(48, generator=generator) if with_bias else None
    packed = torch_compat.onednn_pack_linear_weight(weight)
    expected = torch.nn.functional.linear(x, weight, bias)
    torch.testing.assert_close(torch_compat.linear_on_onednn_packed(x, packed, bias), expected, rtol=1e-4, atol=1e-4)
    scripted = torch_compat.script_function(torch_compat.linear_on_onednn_packed)
    torch.testing.assert_close(scripted(x, packed, bias), expected, rtol=1e-4, atol=1e-4)


def test_the_build_lock_is_the_file_torch_builds_extensions_under(tmp_path):
    """torch names the lock in its source only: the compat entry and torch's build agree on the installed torch."""
    from torch.utils import cpp_extension

    lock = torch_compat.cpp_extension_build_lock(tmp_path)
    assert lock.parent == tmp_path
    assert f"FileBaton(os.path.join(build_directory, '{lock.name}'))" in inspect.getsource(cpp_extension)


def _rows_by_index(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    indices: list[int] = index.tolist()
    rows: list[torch.Tensor] = []
    for i in indices:
        rows.append(x[i])
    return torch.stack(rows)


def test_a_scripted_function_runs_its_loop_for_any_input():
    scripted = torch_compat.script_function(_rows_by_index)
    x = torch.arange(12.0).view(4, 3)
    assert torch.equal(scripted(x, torch.tensor([3, 0])), x[[3, 0]])
    assert torch.equal(scripted(x, torch.tensor([1, 1, 2])), x[[1, 1, 2]])


def test_a_traced_module_replays_without_optimisation(recwarn):
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(2, 4)
    trace = torch_compat.trace_module(module, (x,))
    assert not [w for w in recwarn if "jit" in str(w.message)]  # torch's deprecation and tracer warnings silenced
    with torch_compat.unoptimized_replay():
        for _ in range(3):
            torch.testing.assert_close(trace(x), module(x), rtol=0, atol=0)


def test_a_registered_compile_backend_compiles_until_unregistered():
    compiled: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        compiled.append(gm)
        return gm.forward

    name = "onp_test_compat_backend"
    torch_compat.register_compile_backend(backend, name)
    try:
        assert name in torch.compiler.list_backends(exclude_tags=())
        function = torch.compile(lambda x: x * 2 + 1, backend=name, fullgraph=True)
        assert torch.equal(function(torch.ones(3)), torch.full((3,), 3.0)) and len(compiled) == 1
    finally:
        torch_compat.unregister_compile_backend(name)
        torch.compiler.reset()
    assert name not in torch.compiler.list_backends(exclude_tags=())


class Sharded(torch.nn.Module):
    def __init__(self, cc: Collectives) -> None:
        super().__init__()
        self.cc = cc

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cc.all_reduce(x), self.cc.all_gather_last(x)


def test_the_fake_process_group_runs_the_collectives_the_export_records():
    x = torch.ones(2, 3)
    with export_world(2) as group:
        reduced, gathered = Sharded(Collectives(2, group))(x)
        assert (reduced * 1).shape == (2, 3) and (gathered * 1).shape == (2, 6)  # (the product waits for them)
        program = torch.export.export(Sharded(Collectives(2, group)), (x,), strict=False)
    collectives = [n for n in program.graph.nodes if n.target in torch_compat.group_collective_ops()]
    assert [n.target for n in collectives] == list(torch_compat.group_collective_ops())
    assert all(n.args[-1] == group for n in collectives)  # the group by name, rebound at load (backends/cpu.py)
    assert not torch.distributed.is_initialized()
