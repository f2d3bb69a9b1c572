#!/usr/bin/env bash
# Builds BuildKit's daemon and client (buildkitd, buildctl) from the module pinned in
# hack/tools/buildkit into the cache keyed by version:
#   $TRAINGUARD_CACHE/bin/<program>-<version>   (default cache: <repo>/.cache)
# with a link <program> beside each. They build the project's own images on a machine without
# a container engine (hack/build-images.sh); buildkitd runs its steps with runc
# (hack/build-node.sh builds it). Static Go binaries, as BuildKit's release builds are. A cached
# program is not rebuilt, so a warm run takes well under a second; a cold one on two cores takes
# about 3 minutes. Prints the directory holding the binaries last.
set -euo pipefail

LOG_PREFIX=build-buildkit
source "$(dirname "${BASH_SOURCE[0]}")/lib/gobuild.sh"

# Must match the require line of hack/tools/buildkit/go.mod (checked before anything is built).
BUILDKIT_VERSION=v0.34.2
require_module buildkit github.com/moby/buildkit "$BUILDKIT_VERSION"

bk=github.com/moby/buildkit
# The module proxy carries no commit, so the Revision stays empty.
bk_ldflags="-X $bk/version.Version=$BUILDKIT_VERSION -X $bk/version.Package=$bk"
CGO_ENABLED=0 build buildctl "$BUILDKIT_VERSION" buildkit "$bk/cmd/buildctl" "" "$bk_ldflags"
# BuildKit's release tags for the daemon; cgo is off, so seccomp only selects the profile it
# hands to runc.
CGO_ENABLED=0 build buildkitd "$BUILDKIT_VERSION" buildkit "$bk/cmd/buildkitd" \
  osusergo,netgo,static_build,seccomp "$bk_ldflags"

echo "$bin"
