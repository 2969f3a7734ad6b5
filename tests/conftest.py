"""Puts tests/ on sys.path (pytest's rootdir-relative import of this file does it): `import support` works
from every test directory. Holds the fixtures every directory shares."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from support.smollm2 import SmolLM2, export_smollm2

from optimum_neuron_plugin.backends.program_cache import CACHE_ENV

# One CPU compile cache for the session, inherited by every optimum-cli and vllm subprocess: a graph that an
# earlier test already compiled (same model shape, graph and options) is copied, not traced again. It starts
# empty, so every distinct program is still exported by this run (tests/core/test_program_cache.py covers reuse).
if CACHE_ENV not in os.environ:
    os.environ[CACHE_ENV] = _SESSION_CACHE = tempfile.mkdtemp(prefix="onp-compile-cache-")
else:
    _SESSION_CACHE = None


@pytest.fixture(scope="session", autouse=True)
def _remove_session_compile_cache():
    yield
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> SmolLM2:
    """SmolLM2 exported once for the whole session (support.smollm2.SHAPE), by the CLI from the GGUF."""
    exported = export_smollm2(tmp_path_factory.mktemp("smollm2") / "artifact")
    assert exported.export.returncode == 0, exported.export.stderr
    return exported
