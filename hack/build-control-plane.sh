#!/usr/bin/env bash
# Builds the local control plane's programs (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok, helm) from the Go
# modules pinned under hack/tools/, into a cache keyed by version:
#   $TRAINGUARD_CACHE/bin/<program>-<version>   (default cache: <repo>/.cache)
# A program already in the cache is not rebuilt, so a warm run takes seconds.
# Prints the directory holding the binaries (as links without versions) last.
set -euo pipefail

LOG_PREFIX=build-control-plane
source "$(dirname "${BASH_SOURCE[0]}")/lib/gobuild.sh"

# The versions below must match the require lines of hack/tools/*/go.mod
# (checked before anything is built).
KUBE_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v4.3.2

# Static binaries, with the tags of Kubernetes' own release builds.
export CGO_ENABLED=0
tags=selinux,notest,grpcnotrace

require_module kubernetes k8s.io/kubernetes "$KUBE_VERSION"
require_module etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
require_module kwok sigs.k8s.io/kwok "$KWOK_VERSION"
require_module helm helm.sh/helm/v4 "$HELM_VERSION"

build etcd "$ETCD_VERSION" etcd go.etcd.io/etcd/server/v3 "$tags"
build kwok "$KWOK_VERSION" kwok sigs.k8s.io/kwok/cmd/kwok "$tags"
build helm "$HELM_VERSION" helm helm.sh/helm/v4/cmd/helm "$tags" \
  "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  build "$c" "$KUBE_VERSION" kubernetes "k8s.io/kubernetes/cmd/$c" "$tags" \
    "$(kube_version_ldflags "$KUBE_VERSION")"
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
