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


def test_a_tokenizer_that_does_not_load_fails_the_export(tmp_path):
    from support.tiny_models import save_tiny

    from optimum_neuron_plugin import ExportError

    model = save_tiny(tmp_path / "tiny")
    assert load_source(model).tokenizer is None  # no tokenizer files: exported without one (served with token ids)
    (model / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    (model / "tokenizer.json").write_text("{truncated")
    with pytest.raises(ExportError) as raised:
        load_source(model)
    message = str(raised.value)
    assert message.startswith(f"cannot load the tokenizer of {model}: ")
    assert "repair the tokenizer files or install the package they need, then export again" in message
