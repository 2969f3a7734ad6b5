"""Session fixtures for the reliability tests: tiny artifacts and corrupt variants, two servers, refusals.

- `server`: `vllm serve` of the chunked tiny model (batch 4, sequence 128, chunks of 16, on-device
  sampling) in the default serial prefill mode; the bad-request, abort, overload and soak modules share it.
- `interleaved_server`: `vllm serve` in interleaved prefill mode of a tiny model whose embedding table
  (1000 rows) is smaller than its tokenizer (49152 ids): a prompt with a larger id makes the prefill
  graph raise at run time (the graph-failure tests), and prompts are prefilled over several engine
  steps (aborts in the middle of a prefill).
- `refusals`: `vllm serve` runs that must exit non-zero at startup (corrupt artifacts, a --tensor-parallel-size
  the artifact cannot run), started in the background, two at a time, from the first test of the directory on.

Everything listens on and talks to 127.0.0.1; every process is stopped by PID, and gets SIGTERM
if the test process dies first (support.server).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.client import completion_tokens, greedy
from support.served import CHUNK, SEQUENCE_LENGTH, SHAPE, save_served_tiny
from support.server import serve
from support.tiny_models import export, save_tiny
from transformers import AutoTokenizer

from .helpers import Refusals

SMALL_VOCAB = 1000
# small_vocab_dir's prefill buckets: one context bucket (6 graphs instead of the default ladder's 23; its tests are not
# about buckets).
SMALL_VOCAB_PREFILL_BUCKETS = (0, SEQUENCE_LENGTH)
SERVER_START_TIMEOUT = 300


@pytest.fixture(scope="session")
def rel_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reliability")


@pytest.fixture(scope="session")
def tiny_hf_dir(rel_root) -> Path:
    return save_served_tiny(rel_root / "tiny-hf")


@pytest.fixture(scope="session")
def tokenizer(tiny_hf_dir):
    return AutoTokenizer.from_pretrained(tiny_hf_dir)


@pytest.fixture(scope="session")
def chunked_dir(rel_root, tiny_hf_dir) -> Path:
    return export(tiny_hf_dir, rel_root / "chunked", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True)


@pytest.fixture(scope="session")
def small_vocab_dir(rel_root, tiny_hf_dir) -> Path:
    """The tiny Llama with a 1000-row embedding table, exported with SmolLM2's 49152-id tokenizer.

    vLLM accepts any id the tokenizer knows, so a prompt id >= 1000 reaches the graph, whose
    embedding lookup raises (IndexError) at run time; ids < 1000 are served normally.
    """
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf_dir)
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = dict(vocab_size=SMALL_VOCAB, tie_word_embeddings=False, max_position_embeddings=256, **special)
    source = save_tiny(rel_root / "small-vocab-hf", "llama", seed=1, **config)
    tokenizer.save_pretrained(source)
    return export(
        source, rel_root / "small-vocab", **SHAPE, prefill_chunk_size=CHUNK, on_device_sampling=True,
        context_buckets=(SEQUENCE_LENGTH,), prefill_buckets=SMALL_VOCAB_PREFILL_BUCKETS,
    )  # fmt: skip


# ---- corrupt artifacts and startup mismatches ------------------------------------------------------


def corrupt_variants(chunked: Path, foreign: Path, root: Path) -> dict[str, Path]:
    """Copies of the chunked artifact, each broken in one way."""

    def variant(name: str) -> Path:
        directory = root / name
        if directory.exists():
            shutil.rmtree(directory)
        shutil.copytree(chunked, directory)
        return directory

    def edit_config(directory: Path, change) -> None:
        path = directory / "neuron_config.json"
        config = json.loads(path.read_text())
        change(config)
        path.write_text(json.dumps(config, indent=2))

    variants = {}
    variants["missing-graph"] = directory = variant("missing-graph")
    (directory / "graphs/token_generation_128.pt2").unlink()
    variants["truncated-weights"] = directory = variant("truncated-weights")
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    variants["newer-format"] = directory = variant("newer-format")
    edit_config(directory, lambda c: c.update(format_version=c["format_version"] + 1))
    variants["missing-field"] = directory = variant("missing-field")
    edit_config(directory, lambda c: c.pop("sequence_length"))
    # A token_generation graph of another export (a 1000-row embedding): it loads, then fails on its first call.
    variants["foreign-graph"] = directory = variant("foreign-graph")
    graph = "graphs/token_generation_128.pt2"
    shutil.copyfile(foreign / graph, directory / graph)
    return variants


# The corrupt artifacts started with `vllm serve`, one per startup step that fails: neuron_config.json read by the
# API server, the artifact loaded in the engine process, its graphs' warm-up. The other variants fail in the same
# function as one of these (NeuronConfig.load, NeuronModelForCausalLM.from_pretrained): test_faults.py calls it.
STARTUP_RUNS = ("missing-field", "missing-graph", "foreign-graph")


@pytest.fixture(scope="session")
def corrupt(rel_root, chunked_dir, small_vocab_dir) -> dict[str, Path]:
    return corrupt_variants(chunked_dir, small_vocab_dir, rel_root / "corrupt")


@pytest.fixture(scope="session")
def refusals(rel_root, chunked_dir, corrupt):
    variants = corrupt
    cases = {name: (variants[name], []) for name in STARTUP_RUNS}
    # The engine options the plugin's configuration check refuses fail in the check that refuses missing-field (vLLM's
    # configuration validation in the API server): they are checked in-process (tests/vllm/test_refused_options.py).
    # Refused while the command line is parsed (the platform's argument hook), before any configuration is built.
    cases["tensor-parallel-size"] = (chunked_dir, ["--tensor-parallel-size", "2"])
    runner = Refusals(cases, rel_root / "refusal-logs", workers=2)
    yield runner
    runner.close()


@pytest.fixture(scope="session", autouse=True)
def _start_refusals_early(request):
    """Start the refusal runs before the first test when any selected test needs them (they overlap the rest)."""
    if any("refusals" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("refusals")


# ---- servers --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def server(chunked_dir, rel_root):
    yield from serve(chunked_dir, rel_root / "server.log", timeout=SERVER_START_TIMEOUT)


@pytest.fixture(scope="session")
def interleaved_server(small_vocab_dir, rel_root):
    stats = rel_root / "interleaved-stats.jsonl"
    for server in serve(
        small_vocab_dir,
        rel_root / "interleaved-server.log",
        "--additional-config",
        json.dumps({"prefill_mode": "interleaved"}),
        env={"ONP_STATS_FILE": str(stats)},
        timeout=SERVER_START_TIMEOUT,
    ):
        server.stats_file = stats
        yield server


class Alone:
    """Greedy outputs of prompts run alone on a server (one request, nothing else in flight), computed once."""

    def __init__(self, server) -> None:
        self.server = server
        self.cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def __call__(self, prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in self.cache:
            self.cache[key] = completion_tokens(self.server.port, greedy(self.server.model, list(prompt), max_tokens))
        return self.cache[key]


@pytest.fixture(scope="session")
def alone(server) -> Alone:
    return Alone(server)


@pytest.fixture(scope="session")
def alone_interleaved(interleaved_server) -> Alone:
    return Alone(interleaved_server)
