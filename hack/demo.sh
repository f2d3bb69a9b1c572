#!/usr/bin/env bash
# The main job: set up (idempotent), then the demo: a training run on a local control plane
# survives a silent death and ghost VRAM (`--json`, `--down`, `--name`: see the README).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash hack/setup.sh
exec .venv/bin/trainguard demo "$@"
