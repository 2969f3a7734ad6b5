"""An engine option the plugin cannot honour stops `vllm serve` at startup: exit status and message.

One real server run (conftest `refusals`, started in the background with the first test of this directory, next to
the options test_startup_mismatches.py checks: the plugin reports every refused option at once); every
other refused option is checked in-process through vLLM's own EngineArgs.create_engine_config
(tests/vllm/test_refused_options.py), the path `vllm serve` takes.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # a live `vllm serve`


def test_explicit_async_scheduling_stops_vllm_serve(refusals):
    result = refusals.result("engine-options")
    assert not result.timed_out, result.output[-3000:]
    assert result.returncode != 0, result.output[-3000:]
    assert "async scheduling is not supported (the runner keeps each request's tokens between steps)" in result.output
    assert "remove --async-scheduling" in result.output
    assert "Starting vLLM server" not in result.output
