#!/usr/bin/env bash
# The main job: set up (idempotent), then run the trainguard demo on the local control plane.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash hack/setup.sh
exec .venv/bin/trainguard demo "$@"
