#!/usr/bin/env bash
# Builds the local control plane's programs (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok, helm) from the Go
# modules pinned under hack/tools/, into a cache keyed by version:
#   $TRAINGUARD_CACHE/bin/<program>-<version>   (default cache: <repo>/.cache)
# A program already in the cache is not rebuilt, so a warm run takes seconds.
# Prints the directory holding the binaries (as links without versions) last.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TRAINGUARD_CACHE:-$repo/.cache}"
bin="$cache/bin"
mkdir -p "$bin"

# The versions below must match the require lines of hack/tools/*/go.mod
# (checked at the end of this script).
KUBE_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v4.3.2

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -trimpath"

log() { printf '[build-control-plane] %s\n' "$*" >&2; }

# build <program> <version> <tools-module-dir> <package> [ldflags]
build() {
  local name=$1 version=$2 moddir=$3 pkg=$4 ldflags=${5:-}
  local out="$bin/$name-$version"
  if [[ -x "$out" ]]; then
    log "$name $version: cached"
  else
    log "$name $version: building $pkg (a cold build takes minutes)"
    local start=$SECONDS
    (cd "$repo/hack/tools/$moddir" && \
      go build -tags=selinux,notest,grpcnotrace -ldflags "-s -w $ldflags" -o "$out.tmp" "$pkg")
    mv "$out.tmp" "$out"
    log "$name $version: built in $((SECONDS - start)) s"
  fi
  ln -sfn "$name-$version" "$bin/$name"
}

kube_minor=${KUBE_VERSION#v1.}; kube_minor=${kube_minor%%.*}
kube_ldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$kube_minor"
  kube_ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

for m in "kubernetes k8s.io/kubernetes $KUBE_VERSION" "etcd go.etcd.io/etcd/server/v3 $ETCD_VERSION" \
         "kwok sigs.k8s.io/kwok $KWOK_VERSION" "helm helm.sh/helm/v4 $HELM_VERSION"; do
  set -- $m
  grep -Eq "^(require )?[[:space:]]*$2 $3( |\$)" "$repo/hack/tools/$1/go.mod" || {
    log "hack/tools/$1/go.mod does not require $2 $3; update this script and the module together"
    exit 1
  }
done

build etcd "$ETCD_VERSION" etcd go.etcd.io/etcd/server/v3
build kwok "$KWOK_VERSION" kwok sigs.k8s.io/kwok/cmd/kwok
build helm "$HELM_VERSION" helm helm.sh/helm/v4/cmd/helm \
  "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  build "$c" "$KUBE_VERSION" kubernetes "k8s.io/kubernetes/cmd/$c" "$kube_ldflags"
done

# kwok v0.8 has no built-in stages: take the stock node and pod stages from the kwok
# module that was just downloaded, so the cluster uses exactly the pinned version's YAML.
stages="$cache/kwok-stages-$KWOK_VERSION"
if [[ ! -f "$stages/.complete" ]]; then
  kwok_dir="$(cd "$repo/hack/tools/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  rm -rf "$stages" && mkdir -p "$stages"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           node/chaos/node-not-ready.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml \
           pod/fast/pod-delete.yaml; do
    cp "$kwok_dir/kustomize/stage/$f" "$stages/$(basename "$f")"
  done
  touch "$stages/.complete"
  log "kwok stages copied to $stages"
fi

echo "$bin"
