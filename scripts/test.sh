#!/usr/bin/env bash
# Sets up .venv/ (idempotent), lints, then runs the whole test suite on the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
