"""NeuronModelForCausalLM: owns the compiled graphs and the KV cache, runs the host loops.

- prefill(): the per-sequence chunk loop (chunked_prefill or context_encoding calls)
- decode():  one token_generation call for up to batch_size sequences
- prefill_and_decode(): both in one step, the prompt's first chunk and the decode batch in one
  chunk_and_decode call (the chunk loop goes on for the rest of the prompt)
- generate(): Hugging Face style generation on top of both
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from . import __version__, artifact, backends
from .backends import BackendFactory
from .backends.neuron_ranks import compile_on_ranks
from .config import NeuronConfig
from .errors import ArtifactError, ExportError, InputError
from .graphs import (
    CHUNK_AND_DECODE,
    INDEX_DTYPE,
    TOKEN_GENERATION,
    DecoderGraph,
    GraphSpec,
    example_inputs,
    graph_specs,
)
from .models import sharding
from .models.args import ModelArgs
from .models.collectives import Collectives, export_world
from .models.kv_cache import empty_cache
from .models.llama import weight_names
from .sampling import (
    GREEDY,
    SamplingParams,
    draw_uniform,
    host_topk,
    make_generator,
    params_tensor,
    sample_on_host,
)


@dataclass
class DecodeResult:
    tokens: list[int]
    logits: torch.Tensor | None  # [n, vocab] fp32, cloned; only when sampled on the host


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
    ) -> None:
        self.config, self.neuron_config, self.hf_config = args, neuron_config, hf_config
        self.params, self.tokenizer, self.generation_config = params, tokenizer, generation_config
        self.specs = graph_specs(neuron_config)
        self.graphs_dir = Path(graphs_dir)
        self._by_shape = {(spec.name, spec.rows, spec.bucket): spec for spec in self.specs}
        # The artifact has chunk_and_decode graphs (chunked, batch_size > 1): prefill_and_decode can fuse.
        self.fuses_prefill_and_decode = any(spec.name == CHUNK_AND_DECODE for spec in self.specs)
        nc = neuron_config
        self.backend = make_backend(nc)
        self.plan = sharding.plan_for(args, nc.tp_degree)
        self.group = group if group is not None else tp_group(nc.tp_degree)
        self.rank = 0 if self.group is None else dist.get_rank(self.group)
        self.caches: list[torch.Tensor] = []
        if nc.tp_degree > 1 and self.group is None:
            self.graphs = _NoRanks(nc.tp_degree)
            return
        self.params = sharding.shard_params(params, args, self.plan, self.rank)
        self.caches = empty_cache(
            args.num_hidden_layers, nc.batch_size, nc.sequence_length, self.plan.kv_heads, args.head_dim,
            artifact.torch_dtype(nc),
        )  # fmt: skip
        cc = Collectives(nc.tp_degree, self.group.group_name if self.group is not None else None)
        local = sharding.local_args(args, self.plan)
        modules = [DecoderGraph(local, spec, nc.max_topk, cc) for spec in self.specs]
        self.graphs = self.backend.load(modules, self.params, self.caches, self.graphs_dir)

    @property
    def sharded(self) -> bool:
        """This object holds one rank's shard (tp_degree > 1, loaded in a process group)."""
        return self.plan.degree > 1 and self.group is not None

    # ---- export / save / load -------------------------------------------------------------

    @classmethod
    def export(
        cls,
        model: str | Path,
        neuron_config: NeuronConfig,
        progress: Callable[[str], None] | None = None,
        make_backend: BackendFactory = backends.get_backend,
    ) -> NeuronModelForCausalLM:
        progress = progress or (lambda message: None)
        from .sources import load_source, read_config

        _, args = read_config(model)
        _check_model(neuron_config, args)
        plan = sharding.plan_for(args, neuron_config.tp_degree)
        backend = make_backend(neuron_config)
        backend.check_can_compile()
        progress(f"loading weights of {model}")
        source = load_source(model)
        params = _to_params(source.state_dict, args, artifact.torch_dtype(neuron_config))
        # The weights are stored dequantized (a GGUF source's quantization_config no longer applies).
        hf_config = {k: v for k, v in source.hf_config.items() if k != "quantization_config"}
        hf_config["architectures"] = [args.architecture]
        workdir = Path(tempfile.mkdtemp(prefix="onp-graphs-"))
        try:
            _compile(backend, args, plan, neuron_config, params, workdir, progress)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        model_ = cls(
            args, neuron_config, hf_config, params, workdir, source.tokenizer, source.generation_config,
            make_backend=make_backend,
        )  # fmt: skip
        # The compiled graphs live in workdir until save_pretrained copies them; removed with the model.
        weakref.finalize(model_, shutil.rmtree, workdir, True)
        return model_

    def save_pretrained(self, directory: str | Path) -> None:
        if self.sharded:
            raise InputError("save_pretrained of one tensor-parallel rank is not supported: save the exported model")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        artifact.save_config(self.hf_config, directory)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(directory))
        if self.generation_config is not None:
            self.generation_config.save_pretrained(str(directory))
        artifact.save_weights(self.params, directory)
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
        directory = Path(directory)
        if not directory.is_dir():
            raise ArtifactError(
                f"{directory}: not a directory; give the output directory of `optimum-cli export neuron`"
            )
        neuron_config = artifact.load_neuron_config(directory)
        hf_config, args = artifact.load_config(directory)
        if neuron_config.tp_degree > 1 and group is None and tp_group(neuron_config.tp_degree) is None:
            raise ArtifactError(
                f"{directory}: tp_degree={neuron_config.tp_degree}: load it in each of {neuron_config.tp_degree} "
                f"processes after torch.distributed.init_process_group(world_size={neuron_config.tp_degree})"
            )
        for path in make_backend(neuron_config).graph_files(directory, graph_specs(neuron_config)):
            if not path.is_file():
                raise ArtifactError(f"{path}: missing compiled graph; export the model again")
        params = artifact.load_weights(directory, weight_names(args))
        tokenizer, generation_config = _load_tokenizer(directory)
        try:
            return cls(
                args, neuron_config, hf_config, params, directory, tokenizer, generation_config, group, make_backend
            )
        except (RuntimeError, OSError, ValueError) as error:
            if isinstance(error, ArtifactError):
                raise
            raise ArtifactError(
                f"{directory / 'graphs'}: cannot load a compiled graph ({error}); export again"
            ) from None

    def graph_files(self, name: str | None = None) -> list[Path]:
        """The compiled files of every graph, or of every bucket of graph kind `name`."""
        specs = [spec for spec in self.specs if name in (None, spec.name)]
        return self.backend.graph_files(self.graphs_dir, specs)

    def graph_for(self, name: str, last_positions: Sequence[int], rows: int = 1) -> GraphSpec:
        """The graph `name` of `rows` rows and of the smallest context bucket holding every row's positions up to
        its last."""
        return self._by_shape[name, rows, self.neuron_config.bucket_for(max(last_positions))]

    def warm_up(self) -> None:
        """Runs every compiled graph once on slot 0 (rewritten by the next request that uses it).

        A graph that cannot run (e.g. a file from another export) raises ArtifactError naming its file.
        """
        for spec in self.specs:
            try:
                self.graphs(spec, *example_inputs(spec))
            except Exception as error:  # noqa: BLE001 - shape, dtype or runtime errors all mean "re-export"
                first_line = str(error).splitlines()[0] if str(error) else ""
                raise ArtifactError(
                    f"{', '.join(map(str, self.backend.graph_files(self.graphs_dir, [spec])))}: the compiled graph "
                    f"{spec.name} fails on its first call (context bucket {spec.bucket}; {type(error).__name__}: "
                    f"{first_line}); the artifact is corrupt or mixes files of different exports: export the model again"
                ) from error

    # ---- host loops ---------------------------------------------------------------------------

    def prefill_calls(self, num_tokens: int) -> int:
        return -(-num_tokens // self.neuron_config.prefill_length)

    def prefill(self, seq_id: int, token_ids: Sequence[int], start: int = 0) -> torch.Tensor:
        """The chunk loop: writes K/V of token_ids at positions [start, start + n) of slot seq_id.

        Returns the fp32 logits [vocab] of the last token.
        """
        return self.prefill_batch([(seq_id, token_ids, start)])[0]

    def prefill_batch(self, prompts: Sequence[tuple[int, Sequence[int], int]]) -> list[torch.Tensor]:
        """prefill() of several prompts, each (seq_id, token_ids, start) in a slot of its own: their chunk loops run
        side by side, chunk k of up to prefill_batch_size prompts in one call (a chunk left alone runs the one-prompt
        graph). Same results as prefill() of each; returns each prompt's logits [vocab] of its last token."""
        checked = [(seq_id, self._checked_prompt(seq_id, tokens, start), start) for seq_id, tokens, start in prompts]
        slots = [seq_id for seq_id, _, _ in checked]
        if not checked or len(set(slots)) != len(slots):
            raise InputError(f"prefill_batch needs prompts in distinct slots, got seq_ids {slots}")
        size, width = self.neuron_config.prefill_length, self.neuron_config.prefill_batch_size
        logits: list[torch.Tensor | None] = [None] * len(checked)
        for offset in range(0, max(len(tokens) for _, tokens, _ in checked), size):
            rows = [i for i, (_, tokens, _) in enumerate(checked) if offset < len(tokens)]
            for group in (rows[g : g + width] for g in range(0, len(rows), width)):
                output = self._chunks_call([self._chunk(*checked[i], offset) for i in group])
                for row, i in enumerate(group):
                    if offset + size >= len(checked[i][1]):
                        logits[i] = output[row].clone()  # the runtime may reuse the output buffer
        return logits

    def _chunks_call(self, chunks: list[tuple[tuple, list[int]]]) -> torch.Tensor:
        """One prefill call for n chunks of distinct slots: the one-prompt graph for one, else the n-prompt graph
        (one per width: a padding row would cost as much as a real one)."""
        spec = self.graph_for(self.neuron_config.prefill_graph, [p[-1] for _, p in chunks], rows=len(chunks))
        if len(chunks) == 1:
            return self.graphs(spec, *chunks[0][0])
        return self.graphs(spec, *(torch.cat(column) for column in zip(*(inputs for inputs, _ in chunks), strict=True)))

    def decode(
        self,
        seq_ids: Sequence[int],
        token_ids: Sequence[int],
        positions: Sequence[int],
        sampling: Sequence[SamplingParams] | None = None,
        generators: Sequence[torch.Generator | None] | None = None,
        rows: int | None = None,
    ) -> DecodeResult:
        """One token_generation call: token_ids[i] at positions[i] of slot seq_ids[i]. It runs the graph of `rows`
        rows, by default the fewest (of decode_batch_sizes) that hold the batch."""
        sampling, generators = self._checked_decode(seq_ids, token_ids, positions, sampling, generators)
        fewest = self.neuron_config.decode_rows_for(len(seq_ids))
        if rows is None:
            rows = fewest
        elif rows < fewest or rows not in self.neuron_config.decode_batch_sizes:
            raise InputError(
                f"decode of {len(seq_ids)} sequences cannot run on {rows} rows: this export has token_generation "
                f"graphs of {', '.join(map(str, self.neuron_config.decode_batch_sizes))} rows"
            )
        batch, sampling_inputs = self._batch(seq_ids, token_ids, positions, sampling, generators, rows)
        output = self.graphs(self.graph_for(TOKEN_GENERATION, positions, rows), *batch, *sampling_inputs)
        return self._decoded(output, len(seq_ids), sampling, generators)

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
    ) -> tuple[torch.Tensor, DecodeResult]:
        """prefill(seq_id, token_ids, start) and decode(decode_*), with the decode batch riding in one chunk of the
        prompt: one chunk_and_decode call, one pass over the weights for both. Same results as the two calls.

        The batch rides in the first chunk whose context bucket also holds every decode row, so the chunk never
        attends more cache than it would alone; when no chunk's bucket is large enough (or the artifact has no
        chunk_and_decode graph) it is the two calls. Returns the prefill's logits [vocab] of the last token and
        the decode's result."""
        tokens = self._checked_prompt(seq_id, token_ids, start)
        sampling, generators = self._checked_decode(
            decode_seq_ids, decode_token_ids, decode_positions, sampling, generators
        )
        if seq_id in decode_seq_ids:
            raise InputError(f"slot {seq_id} cannot prefill and decode in the same call")
        fused_at = self._riding_chunk(len(tokens), start, max(decode_positions))
        if fused_at is None:
            result = self.decode(decode_seq_ids, decode_token_ids, decode_positions, sampling, generators)
            return self.prefill(seq_id, tokens, start), result
        # A call that raises leaves the generators as they were: the caller may run the two calls apart instead,
        # and a seeded request then draws what it would have drawn.
        saved = [None if g is None else g.get_state() for g in generators]
        try:
            return self._fused(seq_id, tokens, start, fused_at, decode_seq_ids, decode_token_ids, decode_positions,
                               sampling, generators)  # fmt: skip
        except Exception:
            for generator, state in zip(generators, saved, strict=True):
                if generator is not None:
                    generator.set_state(state)
            raise

    def _fused(self, seq_id, tokens, start, fused_at, decode_seq_ids, decode_token_ids, decode_positions, sampling,
               generators) -> tuple[torch.Tensor, DecodeResult]:  # fmt: skip
        n = len(decode_seq_ids)
        if fused_at:
            self.prefill(seq_id, tokens[:fused_at], start)
        rows = self.neuron_config.batch_size
        batch, sampling_inputs = self._batch(decode_seq_ids, decode_token_ids, decode_positions, sampling, generators,
                                             rows)  # fmt: skip
        chunk, positions = self._chunk(seq_id, tokens, start, fused_at)
        output = self.graphs(self.graph_for(CHUNK_AND_DECODE, [positions[-1]], rows), *chunk, *batch, *sampling_inputs)
        if self.neuron_config.on_device_sampling:
            chunk_logits, tokens_out = output
        else:
            chunk_logits, tokens_out = output[:1], output[1:]
        result = self._decoded(tokens_out, n, sampling, generators)
        after = fused_at + self.neuron_config.prefill_length
        if after < len(tokens):
            return self.prefill(seq_id, tokens[after:], start + after), result
        return chunk_logits[0].clone(), result

    def _riding_chunk(self, num_tokens: int, start: int, last_decode_position: int) -> int | None:
        """Offset of the first chunk whose bucket holds last_decode_position, or None."""
        nc = self.neuron_config
        if not self.fuses_prefill_and_decode:
            return None
        needed = nc.bucket_for(last_decode_position)
        for offset in range(0, num_tokens, nc.prefill_length):
            if nc.bucket_for(start + min(offset + nc.prefill_length, num_tokens) - 1) >= needed:
                return offset
        return None

    def _checked_prompt(self, seq_id: int, token_ids: Sequence[int], start: int) -> list[int]:
        nc = self.neuron_config
        tokens = [int(t) for t in token_ids]
        self._check_seq_id(seq_id)
        if not tokens:
            raise InputError("prefill needs at least one token")
        if start < 0 or start + len(tokens) > nc.sequence_length:
            raise InputError(
                f"positions {start}..{start + len(tokens) - 1} do not fit sequence_length {nc.sequence_length}: "
                "shorten the prompt or export with a larger --sequence-length"
            )
        return tokens

    def _chunk(self, seq_id: int, tokens: list[int], start: int, offset: int) -> tuple[tuple, list[int]]:
        """The inputs of the chunk of tokens at `offset` (positions from start + offset), and its positions."""
        size = self.neuron_config.prefill_length
        chunk = tokens[offset : offset + size]
        positions = list(range(start + offset, start + offset + len(chunk)))
        # Pad a partial chunk by repeating its last token and position (see models/masks.py).
        pad = size - len(chunk)
        ids = torch.tensor([chunk + chunk[-1:] * pad], dtype=INDEX_DTYPE)
        pos = torch.tensor([positions + positions[-1:] * pad], dtype=INDEX_DTYPE)
        return (ids, pos, torch.tensor([seq_id], dtype=INDEX_DTYPE)), positions

    def _batch(self, seq_ids, token_ids, positions, sampling, generators, rows: int) -> tuple[tuple, tuple]:
        """The decode batch's inputs, padded to the graph's rows, and its sampling inputs (on-device sampling).
        sampling and generators: the lists _checked_decode returned."""
        nc = self.neuron_config
        # Pad by repeating row 0: identical inputs write identical K/V to the same place.
        pad = rows - len(seq_ids)
        padded = lambda values: torch.tensor([list(values) + [values[0]] * pad], dtype=INDEX_DTYPE)  # noqa: E731
        batch = (padded(token_ids).T, padded(positions).T, padded(seq_ids)[0])
        if not nc.on_device_sampling:
            return batch, ()
        params = params_tensor(sampling + [sampling[0]] * pad, nc.max_topk)
        uniform = self._from_rank0(torch.cat((draw_uniform(generators), torch.zeros(pad, 1))))
        return batch, (params, uniform)

    def _decoded(self, output: torch.Tensor, n: int, sampling, generators) -> DecodeResult:
        """The graph's token ids (on-device sampling), or its logits sampled on the host."""
        if self.neuron_config.on_device_sampling:
            return DecodeResult(output[:n].tolist(), None)
        logits = output[:n].clone()
        tokens = self._from_rank0(sample_on_host(logits, sampling, generators))
        return DecodeResult(tokens.tolist(), logits)

    def _from_rank0(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's value on every rank: host-drawn randomness (and what it sampled) must agree across ranks."""
        if self.group is not None:
            dist.broadcast(tensor, src=dist.get_global_rank(self.group, 0), group=self.group)
        return tensor

    def _check_seq_id(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.neuron_config.batch_size:
            raise InputError(f"seq_id {seq_id} is out of range: slots are 0..{self.neuron_config.batch_size - 1}")

    def _checked_decode(self, seq_ids, token_ids, positions, sampling, generators) -> tuple[list, list]:
        """Checks a decode batch; returns its sampling params and generators as lists (defaults: greedy, none)."""
        nc = self.neuron_config
        n = len(seq_ids)
        sampling = list(sampling or [GREEDY] * n)
        generators = list(generators or [None] * n)
        if not 1 <= n <= nc.batch_size:
            raise InputError(f"decode got {n} sequences; the model was compiled for batch_size {nc.batch_size}")
        if not len(token_ids) == len(positions) == len(sampling) == len(generators) == n:
            raise InputError("decode needs one token, position, sampling params and generator per sequence")
        if len(set(seq_ids)) != n:
            raise InputError(f"decode got duplicate seq_ids {list(seq_ids)}")
        for seq_id in seq_ids:
            self._check_seq_id(seq_id)
        if any(not 0 <= p < nc.sequence_length for p in positions):
            raise InputError(f"decode positions {list(positions)} exceed sequence_length {nc.sequence_length}")
        return sampling, generators

    # ---- Hugging Face style generation --------------------------------------------------------

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
    ) -> torch.Tensor:
        """Prompt plus new tokens per row, right-padded with the first eos id once a row stops."""
        prompts = _prompts(input_ids, attention_mask)
        nc = self.neuron_config
        if len(prompts) > nc.batch_size:
            raise InputError(
                f"generate got {len(prompts)} sequences; the model was compiled for batch_size {nc.batch_size}"
            )
        eos = _eos_ids(eos_token_id, self.config.eos_token_ids)
        params = SamplingParams(top_k, top_p, temperature) if do_sample else GREEDY
        generators = [
            make_generator(None if seed is None else seed + i) if do_sample else None for i in range(len(prompts))
        ]
        for slot, prompt in enumerate(prompts):
            if len(prompt) >= nc.sequence_length:
                raise InputError(
                    f"prompt {slot} has {len(prompt)} tokens; sequence_length {nc.sequence_length} leaves no room to "
                    "generate: shorten it or export with a larger --sequence-length"
                )
        outputs: list[list[int]] = []
        for slot, prompt in enumerate(prompts):
            logits = self.prefill(slot, prompt)
            cap = host_topk(nc.on_device_sampling, nc.max_topk)
            first = self._from_rank0(sample_on_host(logits[None], [params], [generators[slot]], cap))
            outputs.append([int(first[0])])
        live = [i for i in range(len(prompts)) if outputs[i][-1] not in eos and max_new_tokens > 1]
        while live:
            positions = [len(prompts[i]) + len(outputs[i]) - 1 for i in live]
            result = self.decode(
                live, [outputs[i][-1] for i in live], positions, [params] * len(live), [generators[i] for i in live]
            )
            for i, token in zip(live, result.tokens, strict=True):
                outputs[i].append(token)
            live = [
                i for i in live
                if token_ok(outputs[i], eos) and len(outputs[i]) < max_new_tokens
                and len(prompts[i]) + len(outputs[i]) < nc.sequence_length
            ]  # fmt: skip
        return _pad_outputs(input_ids, prompts, outputs, eos[0] if eos else 0, attention_mask)


def token_ok(tokens: list[int], eos: list[int]) -> bool:
    return tokens[-1] not in eos


def tp_group(degree: int) -> dist.ProcessGroup | None:
    """The default process group for tp_degree `degree`: the torch.distributed world (None for degree 1 or when
    torch.distributed is not initialised); a world of another size is refused."""
    if degree == 1 or not dist.is_initialized():
        return None
    if dist.get_world_size() != degree:
        raise ArtifactError(
            f"tp_degree={degree} but the torch.distributed world has {dist.get_world_size()} processes: start "
            f"{degree} processes, or pass the tensor-parallel group"
        )
    return dist.group.WORLD


class _NoRanks:
    """The graphs of a tp_degree > 1 model outside a process group (the export process): saved, never run."""

    def __init__(self, degree: int) -> None:
        self.degree = degree

    def __call__(self, spec: GraphSpec, *inputs: torch.Tensor) -> torch.Tensor:
        raise InputError(
            f"this model is sharded over tp_degree={self.degree} ranks: save it, then load it with from_pretrained in "
            f"each of {self.degree} processes of a torch.distributed group"
        )


def _compile(backend, args, plan, neuron_config, params, workdir, progress) -> None:
    """Compiles every graph. Under TP on the CPU backend the graphs are traced once on rank 0's shard shapes (every
    rank's are the same) against a fake process group: one rank-independent program per graph and bucket. TorchNeuron
    compiles them for a live group instead: one process per NeuronCore, each on its shard (backends/neuron_ranks.py)."""
    nc = neuron_config
    if nc.tp_degree > 1 and backend.compiles_on_live_ranks:
        compile_on_ranks(backend, args, params, artifact.torch_dtype(nc), workdir, progress)
        return
    shard = sharding.shard_params(params, args, plan, 0)
    caches = empty_cache(
        args.num_hidden_layers, nc.batch_size, nc.sequence_length, plan.kv_heads, args.head_dim,
        artifact.torch_dtype(nc),
    )  # fmt: skip
    local = sharding.local_args(args, plan)
    if nc.tp_degree == 1:
        graphs = [DecoderGraph(local, spec, nc.max_topk) for spec in graph_specs(nc)]
        backend.compile(graphs, shard, caches, workdir, progress)
        return
    if dist.is_initialized():
        raise ExportError(
            f"tp_degree={nc.tp_degree}: export in a process where torch.distributed is not initialised (the graphs "
            "are traced on a fake process group and run later in any group of that size)"
        )
    with export_world(nc.tp_degree) as group:
        cc = Collectives(nc.tp_degree, group)
        graphs = [DecoderGraph(local, spec, nc.max_topk, cc) for spec in graph_specs(nc)]
        backend.compile(graphs, shard, caches, workdir, progress)


def _check_model(neuron_config: NeuronConfig, args: ModelArgs) -> None:
    neuron_config.check_model(args.max_position_embeddings)
    # A model whose every layer slides forgets what lies beyond its window: refused past it. Models that mix
    # sliding and full layers (Gemma 3) serve any length, their sliding layers masked to the window.
    if args.every_layer_slides and args.sliding_window < neuron_config.sequence_length:
        raise ExportError(
            f"sequence_length={neuron_config.sequence_length} exceeds the model's sliding window ({args.sliding_window}); "
            "use a sequence length at most the sliding window"
        )


def _to_params(state_dict: dict[str, torch.Tensor], args: ModelArgs, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    names = weight_names(args)
    missing = [n for n in names if n not in state_dict]
    if missing:
        raise ExportError(f"the checkpoint lacks weight(s) {', '.join(missing[:3])}")
    return {n: state_dict[n].to(dtype).contiguous() for n in names}


def _load_tokenizer(directory: Path) -> tuple[object | None, object | None]:
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = generation_config = None
    if (directory / "tokenizer_config.json").is_file():
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(directory))
        except (OSError, ValueError) as error:
            raise ArtifactError(f"{directory}: tokenizer files are unreadable ({error}); export again") from None
    if (directory / "generation_config.json").is_file():
        generation_config = GenerationConfig.from_pretrained(str(directory))
    return tokenizer, generation_config


def _prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask)
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
    if any(not p for p in prompts):
        raise InputError("generate got an empty prompt")
    return prompts


def _eos_ids(eos_token_id: int | list[int] | None, default: list[int]) -> list[int]:
    if eos_token_id is None:
        return list(default)
    return [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)


def _pad_outputs(input_ids, prompts, outputs, pad_id, attention_mask) -> torch.Tensor:
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    width = max(len(o) for o in outputs)
    new = torch.full((len(outputs), width), pad_id, dtype=ids.dtype)
    for i, tokens in enumerate(outputs):
        new[i, : len(tokens)] = torch.tensor(tokens)
    return torch.cat((ids, new), dim=1)
