#!/usr/bin/env bash
# Builds the Prometheus tools the chart's tests use, from the Prometheus module pinned in
# hack/tools/prometheus, into the cache (default: <repo>/.cache):
#   - promtool, which checks the chart's alerting rules and runs their unit tests
#     (tests/unit/test_chart_alerts.py): $TRAINGUARD_CACHE/bin/promtool-<module version>;
#   - promqlnames (hack/tools/prometheus/promqlnames), which lists the metrics PromQL
#     expressions read, with Prometheus's own parser, so that the tests can check the
#     dashboard's and the rules' queries against what the operator exports:
#     $TRAINGUARD_CACHE/bin/promqlnames-<module version>-<source hash>.
# Each gets a link without the version beside it. Prometheus's service discovery plugins are
# left out (remove_all_sd): the rule commands do not use them, and the cloud SDKs they pull in
# more than double the cold build (531 s against 222 s, and 88 MB against 54 MB). A cached
# program is not rebuilt, so a warm run takes milliseconds; a cold one (empty Go build cache)
# took 222 s on two cores for promtool and 5 s more for promqlnames, and the module downloads
# add about 20 s. Prints the directory holding the binaries last.
set -euo pipefail

LOG_PREFIX=build-prometheus-tools
source "$(dirname "${BASH_SOURCE[0]}")/lib/gobuild.sh"

# Must match the require line of hack/tools/prometheus/go.mod (checked before the build).
# Prometheus publishes its release X.Y.Z as the Go module version v0.<X*100+Y>.Z.
PROMETHEUS_VERSION=v0.316.0
require_module prometheus github.com/prometheus/prometheus "$PROMETHEUS_VERSION"

series=${PROMETHEUS_VERSION#v0.}
series=${series%%.*}
release="$((series / 100)).$((series % 100)).${PROMETHEUS_VERSION##*.}"
# What `promtool --version` prints, set as Prometheus's release builds set it (the module
# proxy carries no commit, so the revision stays empty).
CGO_ENABLED=0 build promtool "$PROMETHEUS_VERSION" prometheus \
  github.com/prometheus/prometheus/cmd/promtool remove_all_sd,netgo \
  "-X github.com/prometheus/common/version.Version=$release"

# The name changes with the helper's source and the module's pins, so it is never stale.
moddir="$repo/hack/tools/prometheus"
hash="$(cat "$moddir/go.mod" "$moddir/go.sum" "$moddir/promqlnames/main.go" | sha256sum | cut -c1-12)"
CGO_ENABLED=0 build promqlnames "$PROMETHEUS_VERSION-$hash" prometheus ./promqlnames ""

echo "$bin"
