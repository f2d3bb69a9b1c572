#!/usr/bin/env bash
# Sets up everything trainguard's demo and tests need on a fresh machine, reusing what is
# already there: a virtualenv in .venv with the project (operator, dev and trainer extras) and the
# control-plane binaries built from the pinned Go modules (hack/build-control-plane.sh), and what
# real nodes run (hack/build-node.sh: kubelet, kube-proxy, containerd, runc, the CNI plugins,
# CoreDNS).
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
# promtool and promqlnames, from the pinned Prometheus module: the chart's alerting rules and
# dashboard queries are checked with them. About 4 minutes cold on two cores, milliseconds warm.
bash hack/build-prometheus-tools.sh >/dev/null
bash hack/install-test-services.sh >/dev/null
# What real nodes run: the default test command runs scenarios on them (tests/realnodes).
# About 2 minutes cold once the control plane is built (plus CoreDNS, up to 9 minutes), under a
# second warm.
bash hack/build-node.sh >/dev/null
# The project's own images (hack/build-images.sh: BuildKit, local bases from Debian's packages
# and PyPI's torch), which the real-node tests run: about 6 minutes on a fresh cache, most of it
# the torch base, built once per cache; 80 s after a change to the project; 0.2 s warm.
bash hack/build-images.sh >/dev/null
# Versioned files only: the links beside them (containerd-shim-runc-v2 among them) are not counted.
log "binaries: $(find .cache/bin -maxdepth 1 -type f -name '*-v*' | wc -l) cached in .cache/bin"
