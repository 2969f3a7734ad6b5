"""How a graph is picked: a call's kind, rows and positions -> the compiled graph (GraphSpec) that runs it.

Rows (graph_rows): token_generation and verify run the fewest compiled rows (NeuronConfig.decode_batch_sizes) that
hold the call, padding rows repeating row 0; chunked_prefill has a graph per prompt count (1..prefill_batch_size: a
padding row would cost as much as a real one); chunk_and_decode always batch_size rows; the others one row.

Bucket (graph_bucket), the cache a call reads (graphs.py: what each kind attends):
- a prompt chunk (chunked_prefill, prompt_logits) starting at s: the smallest prefill bucket >= s (its prior context);
- token_generation: the smallest decode bucket > its largest position;
- chunk_and_decode: the smallest context bucket > the decode rows' positions and >= the chunk's start;
- verify, context_encoding: the smallest context bucket > its largest position; copy_prefix of n positions (last
  position n - 1): the smallest context bucket >= n.

Chunk width (chunk_tokens): a prompt's last piece that fits prefill_tail_size runs on the tail graph, the rest on
whole chunks. Riding chunk (riding_chunk): which chunk of a prompt carries the decode batch in chunk_and_decode.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import NeuronConfig
from ..graphs import CHUNK_AND_DECODE, CHUNKED_PREFILL, PREFILL_CHUNKS, TOKEN_GENERATION, VERIFY, GraphSpec

GraphKey = tuple[str, int, int, bool]  # (kind, compiled rows, bucket, tail)


def spec_key(spec: GraphSpec) -> GraphKey:
    return spec.name, spec.rows, spec.bucket, spec.tail


def call_key(
    nc: NeuronConfig, kind: str, rows: int, starts: Sequence[int], lasts: Sequence[int], tail: bool = False
) -> GraphKey:
    """The key of the graph that runs a call of `kind` (GraphSelector.select's rule, on the shapes alone)."""
    return kind, graph_rows(nc, kind, rows), graph_bucket(nc, kind, starts, lasts), tail


class GraphSelector:
    """The graphs of an export by the calls they run."""

    def __init__(self, neuron_config: NeuronConfig, specs: Sequence[GraphSpec]) -> None:
        self.neuron_config = neuron_config
        self.kinds = {spec.name for spec in specs}
        self._by_shape = {spec_key(spec): spec for spec in specs}

    def select(
        self, kind: str, rows: int, starts: Sequence[int], lasts: Sequence[int], tail: bool = False
    ) -> GraphSpec:
        """The graph of `kind` that runs a call of `rows` rows starting at positions `starts` (prompt chunks) and
        ending at `lasts`; tail: the prefill_tail_size-token chunk graph (chunk_tokens)."""
        return self._by_shape[call_key(self.neuron_config, kind, rows, starts, lasts, tail)]

    def riding_chunk(self, num_tokens: int, start: int, decode_lasts: Sequence[int]) -> int | None:
        """riding_chunk(); None when the export has no chunk_and_decode graphs (the prompt and the decode run apart)."""
        if CHUNK_AND_DECODE not in self.kinds:
            return None
        return riding_chunk(self.neuron_config, num_tokens, start, decode_lasts)


def graph_rows(nc: NeuronConfig, kind: str, rows: int) -> int:
    """The compiled rows of the `kind` graph that runs a call of `rows` rows (at most batch_size)."""
    if kind in (TOKEN_GENERATION, VERIFY):
        return next(n for n in nc.decode_batch_sizes if n >= rows)
    if kind == CHUNK_AND_DECODE:
        return nc.batch_size
    if kind == CHUNKED_PREFILL:
        return rows
    return 1


def graph_bucket(nc: NeuronConfig, kind: str, starts: Sequence[int], lasts: Sequence[int]) -> int:
    """The bucket of the `kind` graph that runs rows starting at `starts` and ending at `lasts` (chunk_and_decode:
    the chunk's start, and the decode rows' positions)."""
    if kind in PREFILL_CHUNKS:
        return next(b for b in nc.prefill_buckets if b >= max(starts))
    if kind == TOKEN_GENERATION:
        return _holding(nc.decode_buckets, max(lasts))
    if kind == CHUNK_AND_DECODE:  # the chunk's prior needs a bucket >= its start, the decode rows one > their positions
        return _holding(nc.context_buckets, max(max(starts) - 1, *lasts))
    return _holding(nc.context_buckets, max(lasts))


def chunk_tokens(nc: NeuronConfig, remaining: int) -> int:
    """Tokens of the compiled chunk that runs a prompt piece with `remaining` tokens from its offset: the tail
    graph's when the rest of the prompt fits in it, else a whole chunk."""
    if 0 < remaining <= nc.prefill_tail_size:
        return nc.prefill_tail_size
    return nc.prefill_length


def riding_chunk(nc: NeuronConfig, num_tokens: int, start: int, decode_lasts: Sequence[int]) -> int | None:
    """Offset of the first chunk of a prompt (num_tokens from `start`) that can carry the decode rows ending at
    `decode_lasts` in one chunk_and_decode call, or None: the first whose call reads no more cache than the
    context bucket of the chunk's own last position."""
    for offset in range(0, num_tokens, nc.prefill_length):
        chunk_last = start + min(offset + nc.prefill_length, num_tokens) - 1
        if graph_bucket(nc, CHUNK_AND_DECODE, [start + offset], decode_lasts) <= _holding(
            nc.context_buckets, chunk_last
        ):
            return offset
    return None


def _holding(buckets: Sequence[int], last_position: int) -> int:
    """The smallest bucket holding cache positions [0, last_position]."""
    return next(b for b in buckets if b > last_position)
