"""GraphSet: an export's loaded graphs with what a host loop needs to call them (shapes, buckets, slots, ranks)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..config import NeuronConfig
from ..errors import InputError
from ..graphs import CHUNK_AND_DECODE, COPY_PREFIX, GraphSpec, call_bucket

GraphCall = Callable[..., torch.Tensor]  # graphs(spec, *inputs): runs the compiled graph of spec


class LoadedOnFirstCall:
    """The graphs of a fresh export, loaded when first used: an export that is only saved (the CLI) never reads
    its programs back, which costs about as much as tracing them."""

    def __init__(self, load: Callable[[], GraphCall]) -> None:
        self._load, self._graphs = load, None

    @property
    def loaded(self) -> GraphCall:
        if self._graphs is None:
            self._graphs = self._load()
        return self._graphs

    def __call__(self, spec: GraphSpec, *inputs: torch.Tensor) -> torch.Tensor:
        return self.loaded(spec, *inputs)

    def __getattr__(self, name: str):
        return getattr(self.loaded, name)


@dataclass
class GraphSet:
    neuron_config: NeuronConfig
    specs: list[GraphSpec]
    graphs: GraphCall
    group: dist.ProcessGroup | None = None
    vocab_size: int = 0  # the model's: logit_bias ids are checked against it
    _by_shape: dict[tuple[str, int, int, bool], GraphSpec] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_shape = {(spec.name, spec.rows, spec.bucket, spec.tail): spec for spec in self.specs}

    @property
    def fuses_prefill_and_decode(self) -> bool:
        """The artifact has chunk_and_decode graphs (chunked, batch_size > 1)."""
        return any(spec.name == CHUNK_AND_DECODE for spec in self.specs)

    @property
    def copies_prefixes(self) -> bool:
        """The artifact has copy_prefix graphs (NeuronConfig.prefix_copy)."""
        return any(spec.name == COPY_PREFIX for spec in self.specs)

    @property
    def bitmask_words(self) -> int:
        """int32 words per row of the decode graphs' token bitmask input (0: they take none, token_bitmask false)."""
        return max((spec.bitmask_words for spec in self.specs), default=0)

    @property
    def logit_bias_slots(self) -> int:
        """(token id, bias) pairs per row of the decode graphs' logit_bias input (0: they take none)."""
        return max((spec.logit_bias for spec in self.specs), default=0)

    def graph_for(
        self, name: str, last_positions: Sequence[int], rows: int = 1, starts: Sequence[int] = (0,), tail: bool = False
    ) -> GraphSpec:
        """The graph `name` of `rows` rows and of the smallest bucket that runs rows starting at `starts` and ending
        at `last_positions` (graphs.call_bucket); tail: its prefill_tail_size-token chunk graph."""
        return self._by_shape[name, rows, call_bucket(self.neuron_config, name, starts, last_positions), tail]

    def check_seq_id(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.neuron_config.batch_size:
            raise InputError(f"seq_id {seq_id} is out of range: slots are 0..{self.neuron_config.batch_size - 1}")
