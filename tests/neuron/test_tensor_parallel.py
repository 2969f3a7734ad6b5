"""Tensor parallelism on the neuron backend, with the stand-in compiler (fake_compiler.py) on the cpu device.

The export of a tiny Llama (4 query heads, 2 KV heads) at tp 2 starts 2 rank processes; each compiles every graph
for the live process group (gloo here; TorchNeuron's "neuron" group on a device) into the artifact's one cache, and
the manifests list every file. The artifact then loads in 2 processes, finds every graph in that cache and
generates HF's greedy tokens. A rank failing to compile ends the export with one line naming the rank.

The export's ranks, and the loading ranks that join their group through the backend, form the group as on a device:
a stand-in for TorchNeuron's "neuron" process group (FakeNeuronProcessGroup: it replaces the whole group and refuses
host tensors), with host tensors (barriers, the sampling draws every rank must share) on a gloo group beside it.
"""

from __future__ import annotations

import json
import multiprocessing
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support.references import hf_greedy, runtime_greedy
from support.tiny_models import save_tiny, tiny_model

from optimum_neuron_plugin import ExportError, NeuronConfig, NeuronModelForCausalLM
from optimum_neuron_plugin.backends.neuron import CACHE_DIR, CACHE_ENV, NeuronBackend
from optimum_neuron_plugin.graphs import graph_specs
from tests.core.helpers import SEEDS, VOCAB, prompt
from tests.neuron.fake_compiler import (
    FAILS_ON_RANK_1,
    FAILURE,
    FAKE,
    FAKE_PROCESS_GROUP,
    HOST_TENSOR_REFUSED,
    LOG_ENV,
    MODULE,
    FakeNeuronProcessGroup,
    read_log,
)

pytestmark = pytest.mark.slow  # rank processes export and serve the artifact

TP = 2
SHAPE = dict(
    backend="neuron",
    batch_size=2,
    sequence_length=32,
    prefill_chunk_size=8,
    context_buckets=(16, 32),
    prefill_buckets=(0, 32),
)
PROMPT = prompt(13, seed=3)  # 2 chunks; decoding crosses from bucket 16 to bucket 32
NEW_TOKENS = 10
FAKE_BACKEND = partial(
    NeuronBackend, compiler=FAKE, device="cpu", compiler_module=MODULE, process_group=FAKE_PROCESS_GROUP
)


def export(source: Path, output: Path, tp_degree: int, make_backend=FAKE_BACKEND) -> Path:
    model = NeuronModelForCausalLM.export(source, NeuronConfig(**SHAPE, tp_degree=tp_degree), make_backend=make_backend)
    model.save_pretrained(output)
    return output


def greedy_in_the_backends_group(rank: int, artifact: Path, out: Path) -> None:
    """A serving rank as vLLM's worker starts it: the backend joins the ranks' group, then the artifact loads and
    runs every graph once (each must be found in the artifact's cache) before its greedy tokens."""
    torch.set_num_threads(1)
    backend = FAKE_BACKEND(NeuronConfig(**SHAPE, tp_degree=TP))
    backend.init_process_group(rank, TP, f"file://{out}/rendezvous", timedelta(minutes=15))  # a loaded host
    try:
        assert isinstance(dist.group.WORLD, FakeNeuronProcessGroup)
        model = NeuronModelForCausalLM.from_pretrained(artifact, make_backend=FAKE_BACKEND)
        model.warm_up()
        torch.save(runtime_greedy(model, PROMPT, NEW_TOKENS), out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("hf") / "llama", "llama", seed=SEEDS["llama"], vocab_size=VOCAB)


@pytest.fixture(scope="module")
def run(source, tmp_path_factory) -> dict:
    """The tp 2 export (compile log of its ranks) and its greedy tokens on 2 loading ranks (their compile log)."""
    root = tmp_path_factory.mktemp("neuron-tp")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(CACHE_ENV, "unset")  # restored: the backend points it at each artifact
        env.setenv(LOG_ENV, str(root / "export.log"))
        artifact = export(source, root / "tp2", TP)
        env.setenv(LOG_ENV, str(root / "load.log"))
        mp.spawn(greedy_in_the_backends_group, args=(artifact, root), nprocs=TP, join=True)
    return {
        "artifact": artifact,
        "export_log": read_log(root / "export.log"),
        "load_log": read_log(root / "load.log"),
        "ranks": [torch.load(root / f"rank{r}.pt") for r in range(TP)],
    }


def test_every_rank_compiles_every_graph_into_the_artifacts_one_cache(run):
    artifact = run["artifact"]
    vocab = json.loads((artifact / "config.json").read_text())["vocab_size"]
    specs = graph_specs(NeuronConfig(**SHAPE, tp_degree=TP), vocab)
    assert json.loads((artifact / "neuron_config.json").read_text())["tp_degree"] == TP
    by_rank = {r: [key for rank, key, _ in run["export_log"] if rank == r] for r in range(TP)}
    assert all(len(keys) == len(specs) == 6 for keys in by_rank.values())  # every graph once on every rank
    assert set(by_rank[0]) == set(by_rank[1])  # the same graphs: the cache keys do not depend on the rank
    cache = artifact / "graphs" / CACHE_DIR
    neffs = {p.relative_to(artifact / "graphs").as_posix() for p in cache.rglob("*.neff")}
    assert {Path(name).stem for name in neffs} == set(by_rank[0])
    listed = [json.loads((artifact / "graphs" / f"{spec.key}.neuron.json").read_text()) for spec in specs]
    assert all(len(manifest["cache_files"]) == 1 for manifest in listed)
    assert {name for manifest in listed for name in manifest["cache_files"]} == neffs


def test_two_ranks_in_the_backends_group_load_their_shards_and_generate_hf_greedy_tokens(run):
    """The ranks join the group through the backend, as vLLM's workers do (a stand-in for TorchNeuron's "neuron"
    group, refusing host tensors): the runtime broadcasts rank 0's sampling draws over the gloo group beside it."""
    expected = hf_greedy(tiny_model("llama", seed=SEEDS["llama"], vocab_size=VOCAB), PROMPT, NEW_TOKENS)
    assert run["ranks"] == [expected] * TP
    exported = {key for _, key, _ in run["export_log"]}
    for r in range(TP):  # each rank found every graph in the artifact's cache and compiled nothing
        assert {(key, what) for rank, key, what in run["load_log"] if rank == r} == {(key, "hit") for key in exported}


def test_a_rank_failing_to_compile_fails_the_export_with_one_line_naming_it(source, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "unset")
    failing = partial(NeuronBackend, compiler=FAILS_ON_RANK_1, device="cpu", compiler_module=MODULE)
    with pytest.raises(ExportError) as raised:
        NeuronModelForCausalLM.export(source, NeuronConfig(**SHAPE, tp_degree=TP), make_backend=failing)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"tensor-parallel export on {TP} ranks failed: rank 1: compiling graph chunked_prefill_0")
    assert FAILURE in message
    assert not multiprocessing.active_children()  # rank 0, blocked in the graph's collective, was stopped


def test_the_stand_in_neuron_group_replaces_the_whole_group_as_torch_makes_it(tmp_path):
    """Why the world is not "cpu:gloo,neuron:neuron": the gloo half is dropped (the stand-in takes the "meta" slot)."""
    dist.init_process_group(
        f"cpu:gloo,meta:{FAKE_PROCESS_GROUP}", init_method=f"file://{tmp_path}/r", rank=0, world_size=1
    )
    try:
        assert isinstance(dist.group.WORLD, FakeNeuronProcessGroup)
        with pytest.raises(RuntimeError, match=HOST_TENSOR_REFUSED):
            dist.broadcast(torch.zeros(1), src=0)
    finally:
        dist.destroy_process_group()
