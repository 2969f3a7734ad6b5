"""The benchmark tests' shared fixtures: a tiny random Llama with SmolLM2's tokenizer and an export of it, cached
across runs (rebuilt when missing)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmark"
sys.path[:0] = [str(BENCH), str(BENCH / "tools")]
FIXTURE_VERSION = 3


@pytest.fixture(scope="session")
def bench_cache(pytestconfig) -> Path:
    """Cached across runs: the tiny model and its exports."""
    return Path(pytestconfig.cache.mkdir(f"benchmark-fixtures-v{FIXTURE_VERSION}"))


def build_once(target: Path, build: Callable[[Path], object]) -> Path:
    """`target` built by `build` into a scratch directory renamed into place: an interrupted build is never reused."""
    if target.is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


@pytest.fixture(scope="session")
def tiny_model(bench_cache) -> Path:
    import tiny_model as builder

    return build_once(bench_cache / "tiny-llama", lambda out: builder.build(out, max_positions=256))


@pytest.fixture(scope="session")
def tiny_artifact(bench_cache, tiny_model) -> Path:
    """The tiny model exported as the served and graph cases need it: 4 rows, S 256, 128-token chunks, one context
    bucket (few graphs: quick to export, load and warm up), on-device sampling with logprobs, 4 speculative tokens."""

    def export(out: Path) -> None:
        from optimum_neuron_plugin import NeuronConfig, NeuronModelForCausalLM

        config = NeuronConfig(
            batch_size=4, sequence_length=256, prefill_chunk_size=128, context_buckets=(256,), speculative_tokens=4
        )
        NeuronModelForCausalLM.export(str(tiny_model), config).save_pretrained(out)

    return build_once(bench_cache / "tiny-llama-b4-s256-c128-l256-k4", export)
