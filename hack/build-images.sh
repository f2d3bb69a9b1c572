#!/usr/bin/env bash
# Builds the project's own images on this machine, without a container engine or a registry:
# operator/Dockerfile and trainer-image/Dockerfile, as users build them, by BuildKit
# (hack/build-buildkit.sh) with their base image swapped, through its build argument, for a
# local one made from Debian's packages (and, for the trainer, PyPI's torch). OCI archives for
# `ctr -n k8s.io images import`, cached by content in $TRAINGUARD_CACHE/images (default:
# ~/.cache/trainguard/images, shared by every checkout). See trainguard_dev.images. Cold: about 2 min for the operator image, several
# more for the trainer's torch base (built once per cache); warm: well under a second.
# Arguments: image names (trainguard, trainguard-trainer; default both). Prints, per image:
#   <ref> <archive> <manifest digest> user=<user>
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# runc runs BuildKit's steps: the real nodes' (hack/build-node.sh). Both are cached.
bash "$repo/hack/build-node.sh" >/dev/null
bash "$repo/hack/build-buildkit.sh" >/dev/null
exec "$repo/.venv/bin/python" -m trainguard_dev.images build "$@"
