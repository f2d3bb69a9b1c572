# Sourced by the build scripts of hack/: one way to build a program from a Go tools module
# pinned under hack/tools/ into the cache keyed by version, and to check the pins.
# The sourcing script sets LOG_PREFIX first. Provides: $repo, $cache, $bin (created), log,
# require_module, build and kube_version_ldflags.

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache="${TRAINGUARD_CACHE:-$repo/.cache}"
bin="$cache/bin"
mkdir -p "$bin"
export GOFLAGS="${GOFLAGS:-} -trimpath"

log() { printf '[%s] %s\n' "$LOG_PREFIX" "$*" >&2; }

# require_module <tools-module-dir> <module> <version>: the script's pin is the module's.
require_module() {
  grep -Eq "^(require )?[[:space:]]*$2 $3( |\$)" "$repo/hack/tools/$1/go.mod" || {
    log "hack/tools/$1/go.mod does not require $2 $3; update this script and the module together"
    exit 1
  }
}

# build <program> <version> <tools-module-dir> <package> <tags> [ldflags]
# into $bin/<program>-<version>, linked as $bin/<program>; cgo as $CGO_ENABLED says (default off).
build() {
  local name=$1 version=$2 moddir=$3 pkg=$4 tags=$5 ldflags=${6:-}
  local out="$bin/$name-$version"
  if [[ -x "$out" ]]; then
    log "$name $version: cached"
  else
    log "$name $version: building $pkg (a cold build takes minutes)"
    local start=$SECONDS
    (cd "$repo/hack/tools/$moddir" && \
      CGO_ENABLED="${CGO_ENABLED:-0}" go build -tags="$tags" -ldflags "-s -w $ldflags" \
        -o "$out.tmp" "$pkg")
    mv "$out.tmp" "$out"
    log "$name $version: built in $((SECONDS - start)) s"
  fi
  ln -sfn "$name-$version" "$bin/$name"
}

# kube_version_ldflags <version>: what `--version` of a Kubernetes program prints, set as
# Kubernetes' own release builds set it.
kube_version_ldflags() {
  local version=$1 minor=${1#v1.} flags="" p
  minor=${minor%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    flags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  printf '%s' "$flags"
}
