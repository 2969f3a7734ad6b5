"""decode_batch_sizes: token_generation compiled for several row counts; a decode call runs the graph of the fewest
rows that holds it (a lone request attends and samples one row, not batch_size). Same tokens as HF either way."""

from __future__ import annotations

import pytest
import torch
from support.references import hf_greedy, hf_last_logits

from optimum_neuron_plugin import NeuronConfig
from optimum_neuron_plugin.config import NeuronConfigError
from optimum_neuron_plugin.errors import InputError
from optimum_neuron_plugin.graphs import TOKEN_GENERATION
from optimum_neuron_plugin.runtime.graph_select import graph_rows

from . import helpers

NEW_TOKENS = 6


def test_default_sizes_are_one_row_and_the_batch():
    assert NeuronConfig(batch_size=4).decode_batch_sizes == (1, 4)
    assert NeuronConfig(batch_size=1).decode_batch_sizes == (1,)
    config = NeuronConfig(batch_size=8, decode_batch_sizes=(2, 4, 8))
    assert [graph_rows(config, TOKEN_GENERATION, n) for n in range(1, 9)] == [2, 2, 4, 4, 8, 8, 8, 8]


@pytest.mark.parametrize(
    ("sizes", "allowed"),
    [
        ((2, 1, 4), "strictly increasing"),
        ((1, 2), "ending with batch_size (4)"),
        ((0, 4), "positive"),
        ("1,4", "a list of integers"),
    ],
)
def test_bad_sizes_say_what_is_allowed(sizes, allowed):
    with pytest.raises(NeuronConfigError, match="decode_batch_sizes=") as error:
        NeuronConfig(batch_size=4, decode_batch_sizes=sizes)
    assert allowed in str(error.value)


def _decode_greedy(model, slots: list[int], prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Prefill each prompt in its slot, then decode them together greedily; returns the tokens and the rows of
    every token_generation call."""
    first = [int(model.prefill(slot, prompt).argmax()) for slot, prompt in zip(slots, prompts, strict=True)]
    out, positions = [[t] for t in first], [len(p) for p in prompts]
    with helpers.CallLog(model) as log:
        for _ in range(NEW_TOKENS - 1):
            tokens = model.decode(slots, [row[-1] for row in out], positions).tokens
            positions = [p + 1 for p in positions]
            for row, token in zip(out, tokens, strict=True):
                row.append(token)
    return out, log.rows


@pytest.mark.parametrize("artifact", ["llama_chunked", "llama_logits"])
def test_a_lone_request_decodes_on_the_one_row_graph_and_equals_hf(zoo, llama_logits, artifact):
    """On-device sampling and host logits; slot 2, the last slot: the one-row graph reads and writes that slot's
    blocks, nowhere else."""
    loaded = llama_logits if artifact == "llama_logits" else zoo.artifact("llama", **helpers.CHUNKED)
    model = loaded.model
    prompt = helpers.prompt(19, seed=7)
    before = [cache.clone() for cache in model.caches]
    tokens, rows = _decode_greedy(model, [2], [prompt])
    assert rows == [1] * (NEW_TOKENS - 1)
    assert tokens == [hf_greedy(loaded.hf, prompt, NEW_TOKENS)]
    untouched = helpers.blocks_but(model, 2)  # the other slots', the free ones and the null block
    for cache, old in zip(model.caches, before, strict=True):
        assert torch.equal(cache[untouched], old[untouched])  # the other slots' bytes are untouched


def test_one_row_logits_equal_hf(llama_logits):
    model, prompt = llama_logits.model, helpers.prompt(11, seed=3)
    first = int(model.prefill(1, prompt).argmax())
    with helpers.CallLog(model) as log:
        result = model.decode([1], [first], [len(prompt)])
    assert log.rows == [1]
    torch.testing.assert_close(
        result.logits[0], hf_last_logits(llama_logits.hf, prompt + [first]), rtol=1e-4, atol=1e-4
    )


def test_the_one_row_graph_equals_the_batch_graph_padded(llama_logits):
    """The same request decoded on the one-row graph and, padded, on the 3-row graph: the same logits."""
    model, prompt = llama_logits.model, helpers.prompt(17, seed=9)
    first = int(model.prefill(0, prompt).argmax())
    with helpers.CallLog(model) as log:
        one = model.decode([0], [first], [len(prompt)]).logits[0]
        padded = model.decode([0], [first], [len(prompt)], rows=3).logits[0]
    assert log.rows == [1, 3]
    torch.testing.assert_close(one, padded, rtol=1e-5, atol=1e-5)


def test_rows_the_export_has_no_graph_for_are_refused(llama_logits):
    with pytest.raises(InputError, match="cannot run on 2 rows: this export has token_generation graphs of 1, 3 rows"):
        llama_logits.model.decode([0], [5], [3], rows=2)
    with pytest.raises(InputError, match="decode of 2 sequences cannot run on 1 rows"):
        llama_logits.model.decode([0, 1], [5, 6], [3, 3], rows=1)


def test_two_requests_pad_up_to_the_batch_graph(zoo):
    loaded = zoo.artifact("llama", **helpers.CHUNKED)
    prompts = [helpers.prompt(n, seed=n) for n in (9, 14)]
    tokens, rows = _decode_greedy(loaded.model, [2, 0], prompts)
    assert rows == [3] * (NEW_TOKENS - 1)  # batch 3: no 2-row graph by default
    assert tokens == [hf_greedy(loaded.hf, p, NEW_TOKENS) for p in prompts]


def test_only_the_compiled_sizes_have_graphs(zoo):
    """Exported with decode_batch_sizes (3,): no one-row graph, a lone request pads up to 3 rows."""
    loaded = zoo.artifact("llama", **helpers.CHUNKED, decode_batch_sizes=(3,))
    model = loaded.model
    names = sorted(path.name for path in model.graph_files("token_generation"))
    assert names == [f"token_generation_{bucket}.pt2" for bucket in (16, 32, 64, 8)]
    prompt = helpers.prompt(12, seed=5)
    tokens, rows = _decode_greedy(model, [1], [prompt])
    assert rows == [3] * (NEW_TOKENS - 1)
    assert tokens == [hf_greedy(loaded.hf, prompt, NEW_TOKENS)]
    default = zoo.artifact("llama", **helpers.CHUNKED).model
    assert sum(p.name.startswith("token_generation_x1_") for p in default.graph_files("token_generation")) == 4
