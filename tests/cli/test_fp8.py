"""`optimum-cli export neuron --quantize fp8 --kv-cache-dtype fp8`: FP8 weights in the target's range and an FP8 KV
cache, recorded in neuron_config.json and shown by neuron-plugin-info."""

from __future__ import annotations

import json
import subprocess

from safetensors import safe_open

from .helpers import INFO_CLI, cli_env, run_export

# Two graphs (context_encoding and token_generation, one bucket): what is checked is the stored weights and options.
FP8_EXPORT_ARGS = [
    "--batch-size", "1", "--sequence-length", "64", "--backend", "cpu", "--prefill-chunk-size", "0",
    "--context-buckets", "64",
]  # fmt: skip


def test_quantize_and_kv_cache_dtype_fp8_export_and_show(tiny_models, tmp_path):
    output = tmp_path / "fp8"
    args = ("--quantize", "fp8", "--kv-cache-dtype", "fp8", "--instance-type", "trn2")
    result = run_export("--model", tiny_models["llama"], *FP8_EXPORT_ARGS, *args, output)
    assert result.returncode == 0, result.stderr
    config = json.loads((output / "neuron_config.json").read_text())
    assert (config["quantization"], config["kv_cache_dtype"], config["target"]) == ("fp8", "fp8", "trn2")
    with safe_open(str(output / "model.safetensors"), "pt") as weights:
        down = weights.get_tensor("model.layers.0.mlp.down_proj.weight")
        assert down.dtype.itemsize == 1 and down.float().abs().max() == 240  # trn2's E4M3 range
        assert weights.get_tensor("model.layers.1.self_attn.v_scale").shape == ()
    done = subprocess.run([str(INFO_CLI), str(output)], capture_output=True, text=True, env=cli_env())
    assert done.returncode == 0, done.stderr
    assert (
        "quantization: weights fp8 (14 projections, E4M3 within +-240 for trn2, scales per output channel); "
        "KV cache fp8 (E4M3 within +-240, a K and a V scale per layer)"
    ) in done.stdout


def test_an_unknown_quantization_is_refused(tiny_models, tmp_path):
    result = run_export("--model", tiny_models["llama"], *FP8_EXPORT_ARGS, "--quantize", "int4", tmp_path / "o")
    assert result.returncode != 0 and "invalid choice: 'int4'" in result.stderr and "Traceback" not in result.stderr
