"""An engine option the plugin cannot honour stops `vllm serve` at startup: exit status and message.

One real server run; every other refused option is checked in-process through vLLM's own
EngineArgs.create_engine_config (tests/vllm/test_refused_options.py), the path `vllm serve` takes.
"""

from __future__ import annotations

import pytest

from .helpers import Refusals


@pytest.fixture(scope="module")
def refused(chunked_dir, rel_root):
    runner = Refusals({"prefix-caching": (chunked_dir, ["--enable-prefix-caching"])}, rel_root / "refused-logs", 1)
    yield runner
    runner.close()


def test_explicit_prefix_caching_stops_vllm_serve(refused):
    result = refused.result("prefix-caching")
    assert not result.timed_out, result.output[-3000:]
    assert result.returncode != 0, result.output[-3000:]
    assert "prefix caching is not supported (one cache row per request, no shared blocks)" in result.output
    assert "remove --enable-prefix-caching" in result.output
    assert "Starting vLLM server" not in result.output
