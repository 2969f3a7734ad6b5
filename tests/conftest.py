"""Puts tests/ on sys.path (pytest's rootdir-relative import of this file does it): `import support` works
from every test directory. Holds the fixtures every directory shares."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch
from support.smollm2 import SmolLM2, export_smollm2

from optimum_neuron_plugin.backends.program_cache import CACHE_ENV

# One CPU compile cache for the run, inherited by every xdist worker and every optimum-cli and vllm subprocess: a
# graph that an earlier test already compiled (same model shape, graph and options) is copied, not traced again.
# It starts empty, so every distinct program is still exported by this run (tests/core/test_program_cache.py
# covers reuse). The process that made it (the xdist controller, or pytest without workers) removes it.
if CACHE_ENV not in os.environ:
    os.environ[CACHE_ENV] = _SESSION_CACHE = tempfile.mkdtemp(prefix="onp-compile-cache-")
else:
    _SESSION_CACHE = None

# xdist workers (scripts/test.sh runs two) compute with one intra-op thread each: two workers of two OpenMP
# threads on two cores wait on each other's spinning threads, which makes small graph calls many times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Test files that share a costly session fixture run in one xdist worker (scripts/test.sh runs two); every other
# file is a unit of its own, so no module-scoped server or export is built twice.
SHARED_FIXTURE_GROUPS = {
    "smollm2": ("tests/core/test_smollm2.py", "tests/vllm/test_smollm2_engine.py", "tests/vllm/test_smollm2_pd.py"),
    "reliability servers": ("tests/reliability/",),
    "speculative": ("tests/vllm/test_speculative.py", "tests/vllm/test_speculative_draft.py"),
    "benchmark": ("tests/benchmark/",),
    # Every architecture's shared chunked export (tests/core/helpers.py chunked_shape), built once by one Zoo.
    "core architectures": (
        "tests/core/test_hf_parity.py",
        "tests/core/test_buckets.py",
        "tests/core/test_chunk_and_decode.py",
        "tests/core/test_families.py",
        "tests/core/test_moe.py",
        "tests/core/test_gemma3.py",
    ),
}
# The longest units start first, so that no long unit is left for the end while the other worker idles (seconds of
# one worker on a 2-core AMD EPYC host: the benchmark group ~650, the SmolLM2 group ~310 (its P/D servers ~135 of
# it), the core architectures ~300, Gemma 3's engine ~290, reliability ~260, the AOTInductor export ~210, Neuron
# capture ~175, tensor parallel ~150, SmolLM2's LoRA server ~135 alone, its 32-row pool server ~120, the tiny P/D
# failure servers ~125 alone, speculative ~90).
LONGEST_FIRST = (
    "benchmark",
    "smollm2",
    "core architectures",
    "tests/vllm/test_gemma3_engine.py",
    "reliability servers",
    "tests/cli/test_export_inductor.py",
    "tests/neuron/test_capture.py",
    "tests/core/test_tensor_parallel.py",
    "tests/vllm/test_smollm2_lora.py",
    "tests/vllm/test_smollm2_pool.py",
    "tests/vllm/test_pd_disaggregation.py",
    "speculative",
)


def pytest_unconfigure(config):
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        """xdist's module scheduling with the groups above as single units, the longest first, and a unit handed to
        a worker only when it is down to its last test (xdist's default, two, commits the next unit to a worker whose
        last two tests may run for minutes while the other worker finds the queue empty)."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((name for name, files in SHARED_FIXTURE_GROUPS.items() if path.startswith(files)), path)

        def _assign_work_unit(self, node) -> None:
            for unit in reversed(LONGEST_FIRST):
                if unit in self.workqueue:
                    self.workqueue.move_to_end(unit, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            # A worker runs a test once it knows the next one (for teardown): with one test pending it waits for work.
            if node.shutting_down or not self.workqueue or self._pending_of(self.assigned_work[node]) <= 1:
                super()._reschedule(node)

    return SharedFixtureScheduling(config, log)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> SmolLM2:
    """SmolLM2 exported once for the whole session (support.smollm2.SHAPE), by the CLI from the GGUF."""
    exported = export_smollm2(tmp_path_factory.mktemp("smollm2") / "artifact")
    assert exported.export.returncode == 0, exported.export.stderr
    return exported


@pytest.fixture(scope="session")
def smollm2_runtime(smollm2):
    """The session's SmolLM2 export loaded once with from_pretrained (loading warms up every graph: tens of
    seconds for a real model)."""
    from optimum_neuron_plugin import NeuronModelForCausalLM

    return NeuronModelForCausalLM.from_pretrained(smollm2.directory)
