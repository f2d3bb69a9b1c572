#!/usr/bin/env bash
# Builds and installs what a real node of the local cluster runs, reusing what is already there:
#   - kubelet and kube-proxy, from the same pinned Kubernetes tools module as the control plane
#     (hack/tools/kubernetes), so they share that build cache and its version;
#   - containerd, containerd-shim-runc-v2 and ctr, from the module pinned in
#     hack/tools/containerd (containerd 2: Kubernetes 1.35 was the last to support 1.x);
#   - runc, from the module pinned in hack/tools/runc (cgo and libseccomp: runc's nsenter is C);
#   - CoreDNS, the cluster DNS of the real nodes (pods find a gang's members by their stable
#     names), from the module pinned in hack/tools/coredns: about 9 minutes cold on two busy
#     cores, the largest build here;
#   - from Debian's packages: the CNI plugins (containernetworking-plugins, in /usr/lib/cni),
#     umoci (unpacks OCI image layouts into root filesystems), and the headers runc's build needs.
# Binaries go into the same cache as the control plane's, keyed by version:
#   $TRAINGUARD_CACHE/bin/<program>-<version>   (default cache: <repo>/.cache)
# with a link <program> beside each. A cached program is not rebuilt and an installed package
# is not reinstalled, so a warm run takes well under a second. A cold one on two cores takes about
# 2 minutes where the control plane was built before (Go's build cache holds most of the kubelet)
# and about 7 with an empty Go build cache.
# Needs root for apt-get. Prints the directory holding the binaries last.
set -euo pipefail

LOG_PREFIX=build-node
source "$(dirname "${BASH_SOURCE[0]}")/lib/gobuild.sh"

# The versions below must match the require lines of hack/tools/*/go.mod
# (checked before anything is built).
KUBE_VERSION=v1.36.3
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
COREDNS_VERSION=v1.15.0

require_module kubernetes k8s.io/kubernetes "$KUBE_VERSION"
require_module containerd github.com/containerd/containerd/v2 "$CONTAINERD_VERSION"
require_module runc github.com/opencontainers/runc "$RUNC_VERSION"
require_module coredns github.com/coredns/coredns "$COREDNS_VERSION"

# Debian packages. runc's headers are only needed while runc is still to be built.
packages=(containernetworking-plugins umoci)
if [[ ! -x "$bin/runc-$RUNC_VERSION" ]]; then
  packages+=(gcc libc6-dev pkg-config libseccomp-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if (( ${#missing[@]} )); then
  log "installing from Debian's packages: ${missing[*]}"
  start=$SECONDS
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
    >/dev/null
  log "Debian packages installed in $((SECONDS - start)) s"
else
  log "Debian packages: installed (${packages[*]})"
fi
[[ -x /usr/lib/cni/bridge ]] || { log "no CNI bridge plugin in /usr/lib/cni"; exit 1; }

# kubelet: the control plane's flags exactly (CGO off, the same tags, -trimpath), so a machine
# that built the control plane reuses most of Go's build cache and the version reads the same.
CGO_ENABLED=0 build kubelet "$KUBE_VERSION" kubernetes k8s.io/kubernetes/cmd/kubelet \
  selinux,notest,grpcnotrace "$(kube_version_ldflags "$KUBE_VERSION")"
# kube-proxy: each real node runs one (iptables mode), so pods reach Services such as `kubernetes`.
CGO_ENABLED=0 build kube-proxy "$KUBE_VERSION" kubernetes k8s.io/kubernetes/cmd/kube-proxy \
  selinux,notest,grpcnotrace "$(kube_version_ldflags "$KUBE_VERSION")"

# containerd: static Go binaries, without the btrfs snapshotter (it needs C headers) and with
# Go's own user and DNS lookups (osusergo, netgo), as containerd's release builds do without cgo.
# The shim also leaves out gRPC (no_grpc): it only speaks ttrpc, and one runs per pod.
ctrd=github.com/containerd/containerd/v2
ctrd_tags=urfave_cli_no_docs,no_btrfs,osusergo,netgo
# The module proxy carries no commit, so the version's Revision stays empty.
ctrd_ldflags="-X $ctrd/version.Version=$CONTAINERD_VERSION -X $ctrd/version.Package=$ctrd"
CGO_ENABLED=0 build containerd "$CONTAINERD_VERSION" containerd "$ctrd/cmd/containerd" \
  "$ctrd_tags" "$ctrd_ldflags"
CGO_ENABLED=0 build containerd-shim-runc-v2 "$CONTAINERD_VERSION" containerd \
  "$ctrd/cmd/containerd-shim-runc-v2" "$ctrd_tags,no_grpc" "$ctrd_ldflags"
CGO_ENABLED=0 build ctr "$CONTAINERD_VERSION" containerd "$ctrd/cmd/ctr" "$ctrd_tags" "$ctrd_ldflags"

# runc: cgo is required (its nsenter runs C before the Go runtime starts); the seccomp tag links
# libseccomp, which the kubelet's RuntimeDefault profile needs. runc's own default tags also
# have libpathrs, a Rust library Debian 12 does not package: without it runc uses its Go code
# for the same path checks. The version comes from runc's embedded VERSION file.
CGO_ENABLED=1 build runc "$RUNC_VERSION" runc github.com/opencontainers/runc seccomp,urfave_cli_no_docs

# CoreDNS with its stock plugins (the real nodes use `kubernetes`, `errors` and `bind`).
CGO_ENABLED=0 build coredns "$COREDNS_VERSION" coredns github.com/coredns/coredns ""

echo "$bin"
