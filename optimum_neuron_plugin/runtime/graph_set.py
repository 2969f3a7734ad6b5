"""GraphSet: an export's loaded graphs with what a host loop needs to call them (shapes, buckets, slots, ranks)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..config import NeuronConfig
from ..errors import InputError
from ..graph_inputs import GraphInputs, flat
from ..graphs import CHUNK_AND_DECODE, COPY_PREFIX, GraphSpec
from .block_tables import BlockTables
from .graph_select import GraphSelector
from .lora import AdapterSlots

RunGraph = Callable[..., torch.Tensor]  # graphs(spec, *inputs): runs the compiled graph of spec


class LoadedOnFirstCall:
    """The graphs of a fresh export, loaded when first used: an export that is only saved (the CLI) never reads
    its programs back, which costs about as much as tracing them."""

    def __init__(self, load: Callable[[], RunGraph]) -> None:
        self._load, self._graphs = load, None

    @property
    def loaded(self) -> RunGraph:
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
    graphs: RunGraph
    group: dist.ProcessGroup | None = None
    vocab_size: int = 0  # the model's: logit_bias ids are checked against it
    selector: GraphSelector = field(init=False, repr=False)  # selector.select(kind, rows, starts, lasts)
    calls: Counter[str] = field(default_factory=Counter, repr=False)  # graph name -> its calls (raised ones too)
    tables: BlockTables = field(init=False, repr=False)  # each slot's KV cache blocks
    adapters: AdapterSlots = field(init=False, repr=False)  # each sequence's LoRA slot (exports with max_loras)

    def __post_init__(self) -> None:
        self.selector = GraphSelector(self.neuron_config, self.specs)
        self.tables = BlockTables(self.neuron_config)
        self.adapters = AdapterSlots(self.neuron_config)

    def run(self, spec: GraphSpec, inputs: GraphInputs) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """One call of the compiled graph of spec on its inputs (graph_inputs.py)."""
        self.calls[spec.name] += 1
        return self.graphs(spec, *flat(inputs))

    @property
    def fuses_prefill_and_decode(self) -> bool:
        """The artifact has chunk_and_decode graphs (chunked, batch_size > 1)."""
        return CHUNK_AND_DECODE in self.selector.kinds

    @property
    def copies_prefixes(self) -> bool:
        """The artifact has copy_prefix graphs (NeuronConfig.prefix_copy)."""
        return COPY_PREFIX in self.selector.kinds

    @property
    def bitmask_words(self) -> int:
        """int32 words per row of the decode graphs' token bitmask input (0: they take none, token_bitmask false)."""
        return max((spec.bitmask_words for spec in self.specs), default=0)

    @property
    def logit_bias_slots(self) -> int:
        """(token id, bias) pairs per row of the decode graphs' logit_bias input (0: they take none)."""
        return max((spec.logit_bias for spec in self.specs), default=0)

    def check_seq_id(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.neuron_config.batch_size:
            raise InputError(f"seq_id {seq_id} is out of range: slots are 0..{self.neuron_config.batch_size - 1}")
