"""Puts tests/ on sys.path (pytest's rootdir-relative import of this file does it): `import support` works
from every test directory. Holds the fixtures every directory shares."""

from __future__ import annotations

import pytest
from support.smollm2 import SmolLM2, export_smollm2


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> SmolLM2:
    """SmolLM2 exported once for the whole session (support.smollm2.SHAPE), by the CLI from the GGUF."""
    exported = export_smollm2(tmp_path_factory.mktemp("smollm2") / "artifact")
    assert exported.export.returncode == 0, exported.export.stderr
    return exported
