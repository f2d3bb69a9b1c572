#!/usr/bin/env bash
# The test command: set up (idempotent), then run every tier of the suite
# (unit, apiserver, e2e) against one local control plane started for the run.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash hack/setup.sh
exec .venv/bin/pytest "$@"
