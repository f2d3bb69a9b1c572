"""A real local Kubernetes control plane for tests and the demo (no container engine needed).

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as local
processes built from pinned Go modules (hack/build-control-plane.sh); kwok simulates the
kubelets of GPU nodes. See `trainguard dev cluster --help`.
"""
