#!/usr/bin/env bash
# Sets up everything trainguard's demo and tests need on a fresh machine, reusing what is
# already there: a virtualenv in .venv with the project (operator, dev and trainer extras) and the
# control-plane binaries built from the pinned Go modules (hack/build-control-plane.sh).
# With TRAINGUARD_REAL_NODES=1 it also builds what real nodes run (hack/build-node.sh).
# The development tools (dev/: local control plane, demo, test helpers) are a distribution
# of their own, installed from the checkout beside the product; the product never ships them.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
log() { printf '[setup] %s\n' "$*" >&2; }

python="${PYTHON:-python3}"
"$python" - <<'PY' || { log "Python >= 3.11 is required (set PYTHON=...)"; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  "$python" -m venv .venv
fi
# The constraints pin torch to the version the harness is tested with.
stamp=.venv/.trainguard-installed
want="$(cat pyproject.toml dev/pyproject.toml hack/constraints.txt | sha256sum | cut -c1-16)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  log "installing Python dependencies (torch is large on a fresh machine)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -c hack/constraints.txt -e '.[operator,dev,trainer]' -e ./dev
  echo "$want" > "$stamp"
else
  log "Python dependencies: up to date"
fi

bash hack/build-control-plane.sh >/dev/null
# The Argo CD health check's test runner (gopher-lua) and the servers the remote-layer
# tests run against (sshd from Debian, SeaweedFS built from its pinned Go module).
bash hack/build-luahealth.sh >/dev/null
bash hack/install-test-services.sh >/dev/null
# TRAINGUARD_REAL_NODES=1 also builds and installs what real nodes run (kubelet, containerd,
# runc, CNI plugins: hack/build-node.sh, about 7 minutes cold). Opt-in until a feature runs
# them, so the default set-up and its time are unchanged.
if [[ "${TRAINGUARD_REAL_NODES:-}" == 1 ]]; then
  bash hack/build-node.sh >/dev/null
fi
# Versioned files only: the links beside them (containerd-shim-runc-v2 among them) are not counted.
log "binaries: $(find .cache/bin -maxdepth 1 -type f -name '*-v*' | wc -l) cached in .cache/bin"
