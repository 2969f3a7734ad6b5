"""NeuronModelForCausalLM: the compiled graphs, the weights and the KV cache of one export (one rank's shard under
tensor parallelism), and the host loops as methods: prefill (chunk_loop.py), decode (decode.py), prefill_and_decode
(fused.py), verify (verify.py: speculative decoding), generate (generate.py); export and load in artifact_io.py."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from .. import artifact, backends
from ..backends import BackendFactory
from ..backends.compile_pool import SERIAL, CompileOptions
from ..config import NeuronConfig
from ..errors import ArtifactError, InputError
from ..graph_inputs import CopyInputs
from ..graphs import COPY_PREFIX, DecoderGraph, GraphSpec, example_inputs, graph_specs
from ..models import lora, sharding
from ..models.args import ModelArgs
from ..models.collectives import Collectives
from ..models.kv_cache import empty_pools, split_pools
from ..sampling import SamplingParams
from ..version import __version__
from . import artifact_io, chunk_loop, fused, latency
from . import decode as decode_step
from . import generate as hf_generate
from . import verify as verify_step
from .decode import DecodeResult
from .graph_set import GraphSet, LoadedOnFirstCall, RunGraph
from .lora.peft_adapter import Adapter
from .ranks import NoRanks, tp_group


class NeuronModelForCausalLM:
    """Under tensor parallelism (tp_degree > 1) one object per rank, each in its own process: `group` (default: the
    torch.distributed world, of tp_degree processes) is the ranks' process group, this rank's shard of the weights
    and of the KV cache (its KV heads) is loaded, and every rank must call prefill/decode in lockstep with the same
    arguments; all ranks return the same results. Without a group (the export process) the model is saved, not run.

    `make_backend` builds the compile backend from the NeuronConfig (default: the artifact's, backends.get_backend);
    tests pass one that builds the neuron backend with a stand-in compiler on the cpu device.
    """

    def __init__(
        self,
        args: ModelArgs,
        neuron_config: NeuronConfig,
        hf_config: dict,
        params: dict[str, torch.Tensor],
        graphs_dir: Path,
        tokenizer: object | None = None,
        generation_config: object | None = None,
        group: dist.ProcessGroup | None = None,
        make_backend: BackendFactory = backends.get_backend,
        load_graphs_on_first_call: bool = False,
    ) -> None:
        self.args, self.neuron_config, self.hf_config = args, neuron_config, hf_config
        self.params, self.tokenizer, self.generation_config = params, tokenizer, generation_config
        self.specs = graph_specs(neuron_config, args.vocab_size)
        self.graphs_dir = Path(graphs_dir)
        nc = neuron_config
        self.backend = make_backend(nc)
        self.shard_layout = sharding.layout_for(args, nc.tp_degree)
        self.group = group if group is not None else tp_group(nc.tp_degree)
        self.rank = 0 if self.group is None else dist.get_rank(self.group)
        self.caches: list[torch.Tensor] = []
        self.kv_pools: list[torch.Tensor] = []  # per layer [2, blocks, ...]: K and V, which self.caches views
        self.graph_set = GraphSet(nc, self.specs, NoRanks(nc.tp_degree), self.group, args.vocab_size)
        if nc.tp_degree > 1 and self.group is None:
            return
        self.params = sharding.shard_params(params, args, self.shard_layout, self.rank)
        self.kv_pools = empty_pools(
            args.num_hidden_layers, nc.num_blocks, nc.block_size, self.shard_layout.kv_heads, args.head_dim,
            artifact.cache_dtype(nc),
        )  # fmt: skip
        self.caches = split_pools(self.kv_pools)
        cc = Collectives(nc.tp_degree, self.group.group_name if self.group is not None else None)
        local = sharding.local_args(args, self.shard_layout)
        modules = [DecoderGraph(local, spec, nc.max_topk, cc) for spec in self.specs]
        load = lambda: self.backend.load(modules, self.params, self.caches, self.graphs_dir)  # noqa: E731
        self.graphs = LoadedOnFirstCall(load) if load_graphs_on_first_call else load()

    @property
    def graphs(self) -> RunGraph:
        """graphs(spec, *inputs) runs the compiled graph of spec."""
        return self.graph_set.graphs

    @graphs.setter
    def graphs(self, graphs: RunGraph) -> None:
        self.graph_set.graphs = graphs

    @property
    def fuses_prefill_and_decode(self) -> bool:
        """The artifact has chunk_and_decode graphs: prefill_and_decode can fuse."""
        return self.graph_set.fuses_prefill_and_decode

    @property
    def copies_prefixes(self) -> bool:
        """The artifact has copy_prefix graphs: copy_prefix can run."""
        return self.graph_set.copies_prefixes

    @property
    def sharded(self) -> bool:
        """This object holds one rank's shard (tp_degree > 1, loaded in a process group)."""
        return self.shard_layout.degree > 1 and self.group is not None

    # ---- export / save / load (artifact_io.py) ----------------------------------------------------

    @classmethod
    def export(
        cls,
        model: str | Path,
        neuron_config: NeuronConfig,
        progress: Callable[[str], None] | None = None,
        make_backend: BackendFactory = backends.get_backend,
        options: CompileOptions = SERIAL,
    ) -> NeuronModelForCausalLM:
        return artifact_io.export(cls, model, neuron_config, progress, make_backend, options)

    def save_pretrained(self, directory: str | Path) -> None:
        if self.sharded:
            raise InputError("save_pretrained of one tensor-parallel rank is not supported: save the exported model")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        artifact.save_config(self.hf_config, directory)
        for part in (self.tokenizer, self.generation_config):
            if part is not None:
                part.save_pretrained(str(directory))
        artifact.save_weights({n: t for n, t in self.params.items() if not lora.is_slot_stack(n)}, directory)
        for path in self.graph_files():
            target = directory / path.relative_to(self.graphs_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.resolve() != target.resolve():
                shutil.copyfile(path, target)
        versions = {"optimum_neuron_plugin_version": __version__}
        self.neuron_config.save(directory, **versions, compiler=self.backend.versions())

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        group: dist.ProcessGroup | None = None,
        make_backend: BackendFactory = backends.get_backend,
    ) -> NeuronModelForCausalLM:
        """Loads an export. With tp_degree > 1, call it in each of tp_degree processes of `group` (default: the
        initialised torch.distributed world): each loads its rank's shard."""
        return artifact_io.load(cls, directory, group, make_backend)

    # ---- graphs ----------------------------------------------------------------------------------

    def graph_files(self, name: str | None = None) -> list[Path]:
        """The compiled files of every graph, or of every bucket of graph kind `name`."""
        specs = [spec for spec in self.specs if name in (None, spec.name)]
        return self.backend.graph_files(self.graphs_dir, specs)

    def select(
        self, kind: str, rows: int, starts: Sequence[int], lasts: Sequence[int], tail: bool = False
    ) -> GraphSpec:
        """The graph that runs a call of `kind` (graph_select.py)."""
        return self.graph_set.selector.select(kind, rows, starts, lasts, tail)

    def warm_up(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Runs every compiled graph once on slot 0 (rewritten by the next request that uses it).

        A graph that cannot run (e.g. a file from another export) raises ArtifactError naming its file.
        `progress(done, total)` is called before the first graph and after each.
        """
        progress = progress or (lambda done, total: None)
        progress(0, len(self.specs))
        for done, spec in enumerate(self.specs, 1):
            try:
                self.graphs(spec, *example_inputs(spec))
            except Exception as error:  # noqa: BLE001 - shape, dtype or runtime errors all mean "re-export"
                first_line = str(error).splitlines()[0] if str(error) else ""
                raise ArtifactError(
                    f"{', '.join(map(str, self.backend.graph_files(self.graphs_dir, [spec])))}: the compiled graph "
                    f"{spec.name} fails on its first call ({spec.bucket_label}; {type(error).__name__}: "
                    f"{first_line}); the artifact is corrupt or mixes files of different exports: export the model again"
                ) from error
            progress(done, len(self.specs))

    def measure_latencies(self, keep: Callable[[GraphSpec], bool]) -> latency.GraphLatencies:
        """Seconds of one call of each graph `keep` selects (latency.py); after warm_up."""
        return latency.measure(self.graphs, [spec for spec in self.specs if keep(spec)])

    # ---- host loops ------------------------------------------------------------------------------

    def prefill_calls(self, num_tokens: int) -> int:
        return -(-num_tokens // self.neuron_config.prefill_length)

    def prefill(self, seq_id: int, token_ids: Sequence[int], start: int = 0) -> torch.Tensor:
        """The chunk loop: writes K/V of token_ids at positions [start, start + n) of slot seq_id.

        Returns the fp32 logits [vocab] of the last token.
        """
        return self.prefill_batch([(seq_id, token_ids, start)])[0]

    def prefill_positions(self, seq_id: int, token_ids: Sequence[int], start: int = 0) -> torch.Tensor:
        """prefill() on the prompt_logits graphs (exports with prompt_logprobs): returns the fp32 logits
        [n, vocab] of every token, row i predicting the token after token_ids[i]."""
        return chunk_loop.prefill_positions(self.graph_set, seq_id, token_ids, start)

    def prefill_batch(self, prompts: Sequence[tuple[int, Sequence[int], int]]) -> list[torch.Tensor]:
        """prefill() of several prompts, each (seq_id, token_ids, start) in a slot of its own, their chunk loops side
        by side. Same results as prefill() of each; returns each prompt's logits [vocab] of its last token."""
        return chunk_loop.prefill_batch(self.graph_set, prompts)

    def copy_prefix(self, source: int, destination: int, length: int) -> None:
        """Copies cache positions [0, length) of slot `source` onto slot `destination` (into blocks of its own), every
        layer's K and V, with the copy_prefix graph of the smallest context bucket >= length (the blocks up to that
        bucket are copied too: what the destination held past `length` is no longer valid)."""
        gs = self.graph_set
        if not gs.copies_prefixes:
            raise InputError(
                "this artifact has no copy_prefix graphs: export it again with --prefix-copy (and prefill chunks)"
            )
        for seq_id in (source, destination):
            gs.check_seq_id(seq_id)
        if not 0 < length <= self.neuron_config.sequence_length:
            raise InputError(f"length {length} is out of range: 1..{self.neuron_config.sequence_length}")
        spec = gs.selector.select(COPY_PREFIX, 1, (), [length - 1])
        gs.tables.reserve(destination, length, restart=source != destination)
        source_blocks, destination_blocks = gs.tables.rows([source, destination])
        gs.run(spec, CopyInputs(source_blocks, destination_blocks))

    def decode(
        self,
        seq_ids: Sequence[int],
        token_ids: Sequence[int],
        positions: Sequence[int],
        sampling: Sequence[SamplingParams] | None = None,
        generators: Sequence[torch.Generator | None] | None = None,
        rows: int | None = None,
        bitmask: torch.Tensor | None = None,
    ) -> DecodeResult:
        """One token_generation call: token_ids[i] at positions[i] of slot seq_ids[i]. It runs the graph of `rows`
        rows, by default the fewest (of decode_batch_sizes) that hold the batch. `bitmask` (on-device sampling):
        the packed allowed tokens of each row [n, ceil(vocab / 32)] int32 (decode.DecodeBatch)."""
        batch = decode_step.checked_batch(self.graph_set, seq_ids, token_ids, positions, sampling, generators, bitmask)
        return decode_step.decode(self.graph_set, batch, rows)

    def verify(self, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], starts: Sequence[int]) -> torch.Tensor:
        """One verify call (speculative decoding, verify.py): token_ids[i] (the last sampled token and at most k
        drafts) at positions starts[i], starts[i] + 1, ... of slot seq_ids[i]. Returns the fp32 logits
        [n, k + 1, vocab] of every position; speculative.accept turns a row's into its accepted tokens."""
        batch = verify_step.checked_batch(self.graph_set, seq_ids, token_ids, starts)
        return verify_step.verify(self.graph_set, batch)

    def prefill_and_decode(
        self,
        seq_id: int,
        token_ids: Sequence[int],
        start: int,
        decode_seq_ids: Sequence[int],
        decode_token_ids: Sequence[int],
        decode_positions: Sequence[int],
        sampling: Sequence[SamplingParams] | None = None,
        generators: Sequence[torch.Generator | None] | None = None,
        bitmask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, DecodeResult]:
        """prefill(seq_id, token_ids, start) and decode(decode_*) in one chunk_and_decode call where a chunk's bucket
        holds the decode batch (fused.py). Returns the prefill's logits [vocab] of the last token and the decode's
        result."""
        tokens = chunk_loop.checked_prompt(self.graph_set, seq_id, token_ids, start)
        batch = decode_step.checked_batch(
            self.graph_set, decode_seq_ids, decode_token_ids, decode_positions, sampling, generators, bitmask
        )
        return fused.prefill_and_decode(self.graph_set, seq_id, tokens, start, batch)

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 20,
        do_sample: bool = False,
        top_k: int = 50,
        top_p: float = 1.0,
        temperature: float = 1.0,
        seed: int | None = None,
        eos_token_id: int | list[int] | None = None,
        adapters: Sequence[str | None] | None = None,
    ) -> torch.Tensor:
        """Hugging Face style generation (generate.py): prompt plus new tokens per row, right-padded with the first
        eos id once a row stops. adapters: each row's LoRA adapter by name (load_adapter), None for the base model."""
        return hf_generate.generate(
            self.graph_set,
            self.args.eos_token_ids,
            input_ids,
            attention_mask,
            max_new_tokens,
            do_sample,
            top_k,
            top_p,
            temperature,
            seed,
            eos_token_id,
            adapters,
        )

    # ---- LoRA adapters (lora/; exports with --max-loras) --------------------------------------- -------------------------------------

    @property
    def adapters(self) -> dict[str, int]:
        """The loaded LoRA adapters: name -> slot."""
        return self.graph_set.adapters.loaded

    def read_adapter(self, path: str | Path) -> Adapter:
        """The PEFT LoRA adapter directory at `path`, read on the host and checked against the export."""
        return self.graph_set.adapters.read(path, self.args)

    def load_adapter(self, name: str, adapter: str | Path | Adapter, slot: int | None = None) -> int:
        """Copies the PEFT LoRA adapter at `adapter` (a directory, or read_adapter's) into a free slot (or `slot`)
        under `name`; returns its slot. Every rank loads it (tensor parallelism: its shard). No graph is compiled:
        the adapter is data."""
        gs = self.graph_set
        return gs.adapters.load(self._graph_params(), self.args, self.shard_layout, self.rank, name, adapter, slot)

    def unload_adapter(self, name: str) -> int:
        """Zeroes the slot of adapter `name` (refused while a sequence runs it); returns the slot."""
        return self.graph_set.adapters.unload(self._graph_params(), name)

    def _graph_params(self) -> dict[str, torch.Tensor]:
        """The weights the graphs read: the backend's device copies (neuron), else the host's own (cpu)."""
        return getattr(self.graphs, "params", self.params)

    def set_adapter(self, seq_id: int, name: str | None) -> None:
        """The adapter sequence seq_id runs from its next call on (prefill, decode, verify): its K/V are written
        with that adapter, so set it before the sequence's first prefill. None: the base model."""
        self.graph_set.check_seq_id(seq_id)
        self.graph_set.adapters.assign(seq_id, name)
