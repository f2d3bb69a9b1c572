#!/usr/bin/env bash
# Proves that the runtime hack/build-node.sh built starts on this machine: starts one containerd
# with its own root, state and sockets under a temporary directory, asks it `ctr version`, stops
# it, and removes everything it created. Starts no kubelet and no container. Needs root.
# Usage: bash hack/smoke-containerd.sh   (after hack/build-node.sh)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${TRAINGUARD_CACHE:-$repo/.cache}/bin"
log() { printf '[smoke-containerd] %s\n' "$*" >&2; }

for b in containerd ctr containerd-shim-runc-v2 runc; do
  [[ -x "$bin/$b" ]] || { log "$bin/$b is missing: run hack/build-node.sh first"; exit 1; }
done

# Paths a containerd writes to by default. The config below moves or disables each of them;
# any that appears during the run is reported as a leak and removed.
defaults=(/run/containerd /var/run/containerd /var/lib/containerd /opt/containerd /etc/containerd
          /var/run/nri /run/nri /etc/nri /opt/nri /etc/cni /var/lib/cni /opt/cni)
preexisting=()
for d in "${defaults[@]}"; do [[ -e "$d" ]] && preexisting+=("$d"); done

tmp="$(mktemp -d /tmp/trainguard-smoke-containerd.XXXXXX)"
pid=""
cleanup() {
  local rc=$?
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    wait "$pid" 2>/dev/null || true
  fi
  # containerd mounts under its root (snapshotter checks, tmpmounts): unmount, deepest first,
  # before anything is removed, so that removal never reaches through a mount.
  local m
  for m in $(awk -v t="$tmp" '$5 == t || index($5, t "/") == 1 {print $5}' /proc/self/mountinfo |
             sort -r); do
    log "unmounting $m"
    umount "$m" || { umount -l "$m"; rc=1; }
  done
  rm -rf "$tmp"
  for d in "${defaults[@]}"; do
    if [[ -e "$d" && ! " ${preexisting[*]} " =~ " $d " ]]; then
      log "containerd left $d behind: removing it"
      rm -rf "$d"
      rc=1
    fi
  done
  exit "$rc"
}
trap cleanup EXIT

# Config version 3 is containerd 2's. The CRI plugins (which create /etc/cni/net.d and want a
# kubelet), NRI (a socket under /var/run/nri) and the opt plugin (/opt/containerd) are off; the
# debug and metrics endpoints are off by default.
cat > "$tmp/config.toml" <<EOF
version = 3
root = "$tmp/root"
state = "$tmp/state"
temp = "$tmp/tmp"
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.cri.v1.images",
  "io.containerd.cri.v1.runtime",
  "io.containerd.sandbox.controller.v1.podsandbox",
  "io.containerd.nri.v1.nri",
  "io.containerd.internal.v1.opt",
]

[grpc]
  address = "$tmp/containerd.sock"

[ttrpc]
  address = "$tmp/containerd.sock.ttrpc"
EOF
mkdir -p "$tmp/tmp"

start=$(date +%s.%N)
PATH="$bin:$PATH" "$bin/containerd" --config "$tmp/config.toml" >"$tmp/containerd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  [[ -S "$tmp/containerd.sock" ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/containerd.log" >&2; log "containerd exited"; exit 1; }
  sleep 0.05
done
[[ -S "$tmp/containerd.sock" ]] || { cat "$tmp/containerd.log" >&2; log "no socket after 5 s"; exit 1; }
"$bin/ctr" --address "$tmp/containerd.sock" version
log "containerd answered $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.2f", e - s}') s after start"
