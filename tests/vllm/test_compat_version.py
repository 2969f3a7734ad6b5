"""vllm/compat.py's version gate: the supported range passes, a release outside it is refused naming both."""

import re

import pytest

from optimum_neuron_plugin.vllm.compat import UnsupportedVllmError, check_vllm_version


def test_the_installed_vllm_is_in_the_supported_range():
    assert str(check_vllm_version()).startswith("0.32.0")


@pytest.mark.parametrize("version", ["0.32.0+cpu", "0.32.1"])
def test_releases_in_the_range_pass(version):
    assert check_vllm_version(version).base_version.startswith("0.32")


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.0.0+cpu"])
def test_a_release_outside_the_range_is_refused_naming_both(version):
    with pytest.raises(
        UnsupportedVllmError, match=rf"vLLM >= 0\.32\.0, < 0\.33\.0; vLLM {re.escape(version)} is installed"
    ):
        check_vllm_version(version)
