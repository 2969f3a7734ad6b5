"""Reading a model source: an export reads a GGUF file's metadata once, for its config, weights and tokenizer."""

from __future__ import annotations

import pytest
from support.smollm2 import smollm2_gguf

from optimum_neuron_plugin.sources import gguf_read_once, load_source, read_config


@pytest.mark.slow  # SmolLM2
def test_an_export_parses_a_gguf_file_once(monkeypatch):
    import gguf

    parse, parsed = gguf.GGUFReader, []

    def counted(path, mode="r"):
        parsed.append(path)
        return parse(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", counted)
    path = smollm2_gguf()
    with gguf_read_once():  # as NeuronModelForCausalLM.export reads its source
        _, args = read_config(path)
        source = load_source(path)
    assert len(parsed) == 1
    assert source.args == args and source.tokenizer is not None and len(source.tokenizer) == args.vocab_size
    assert source.state_dict["model.embed_tokens.weight"].shape == (args.vocab_size, args.hidden_size)
