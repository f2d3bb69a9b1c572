#!/usr/bin/env bash
# Installs the servers the remote checkpoint layer tests (tests/integration) run against,
# reusing what is already there:
#   - OpenSSH's sshd, from Debian's packages (the tests start their own on loopback);
#   - SeaweedFS, a real S3-compatible server, built from the Go module pinned in
#     hack/tools/seaweedfs/go.mod into $TRAINGUARD_CACHE/bin/weed-<version> (default cache:
#     <repo>/.cache), linked as .cache/bin/weed. A cold build takes about 20 minutes on two
#     cores (plus a minute of module downloads); a cached one is not rebuilt, and a fresh
#     clone on a machine that built it before relinks from Go's build cache in seconds.
# Needs root for apt-get. Prints the directory holding `weed` last.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TRAINGUARD_CACHE:-$repo/.cache}"
bin="$cache/bin"
mkdir -p "$bin"

# Must match the require line of hack/tools/seaweedfs/go.mod (checked below). SeaweedFS
# publishes no module versions, so the pin is a pseudo-version of a commit.
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6

log() { printf '[install-test-services] %s\n' "$*" >&2; }

if [[ -x /usr/sbin/sshd ]]; then
  log "sshd: installed"
else
  log "sshd: installing openssh-server from Debian's packages"
  # Keep the package from starting a system-wide sshd on port 22: only the tests start one.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server \
    >/dev/null
fi
# sshd refuses to start without its privilege separation directory.
mkdir -p /run/sshd

grep -Eq "^[[:space:]]*github.com/seaweedfs/seaweedfs $SEAWEEDFS_VERSION( |\$)" \
  "$repo/hack/tools/seaweedfs/go.mod" || {
  log "hack/tools/seaweedfs/go.mod does not require seaweedfs $SEAWEEDFS_VERSION; update both"
  exit 1
}
out="$bin/weed-$SEAWEEDFS_VERSION"
if [[ -x "$out" ]]; then
  log "weed $SEAWEEDFS_VERSION: cached"
else
  log "weed $SEAWEEDFS_VERSION: building (a cold build takes about 20 minutes)"
  start=$SECONDS
  (cd "$repo/hack/tools/seaweedfs" && \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.tmp" github.com/seaweedfs/seaweedfs/weed)
  mv "$out.tmp" "$out"
  log "weed $SEAWEEDFS_VERSION: built in $((SECONDS - start)) s"
fi
ln -sfn "weed-$SEAWEEDFS_VERSION" "$bin/weed"
echo "$bin"
