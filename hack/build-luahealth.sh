#!/usr/bin/env bash
# Builds luahealth, the runner of the Argo CD health check test (hack/tools/luahealth: the
# TrainingRun health script in gopher-lua, the Lua VM Argo CD uses), into the cache:
#   $TRAINGUARD_CACHE/bin/luahealth-<gopher-lua version>-<source hash>   (default: <repo>/.cache)
# The name changes with the pinned VM and with the runner's source, so a cached binary is
# never stale and a warm run takes milliseconds. Prints the binary's path last.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TRAINGUARD_CACHE:-$repo/.cache}"
bin="$cache/bin"
moddir="$repo/hack/tools/luahealth"
mkdir -p "$bin"

# Must match the require line of hack/tools/luahealth/go.mod (checked below).
GOPHER_LUA_VERSION=v1.1.1

log() { printf '[build-luahealth] %s\n' "$*" >&2; }

grep -Eq "^[[:space:]]*github.com/yuin/gopher-lua $GOPHER_LUA_VERSION\$" "$moddir/go.mod" || {
  log "hack/tools/luahealth/go.mod does not require gopher-lua $GOPHER_LUA_VERSION; update both"
  exit 1
}
hash="$(cat "$moddir/go.mod" "$moddir/go.sum" "$moddir/main.go" | sha256sum | cut -c1-12)"
out="$bin/luahealth-$GOPHER_LUA_VERSION-$hash"
if [[ -x "$out" ]]; then
  log "luahealth $GOPHER_LUA_VERSION-$hash: cached"
else
  log "luahealth $GOPHER_LUA_VERSION-$hash: building"
  (cd "$moddir" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$out.tmp" .)
  mv "$out.tmp" "$out"
fi
ln -sfn "$(basename "$out")" "$bin/luahealth"
echo "$out"
