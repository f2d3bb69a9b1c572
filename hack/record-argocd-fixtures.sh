#!/usr/bin/env bash
# Regenerates the Argo CD health check's fixtures from statuses the operator really writes:
# runs the e2e scenarios that drive every phase and every rule of the check with
# TRAINGUARD_RECORD_STATUSES set (tests/e2e/conftest.py records each new case of a
# TrainingRun's status), then `python -m trainguard_dev.argocd_fixtures`, which rewrites
# charts/trainguard/argocd/testdata/ and health_test.yaml (and refuses, writing nothing, when
# the recording lacks a phase, a rule or the repeated-failure-with-Continue case), then the
# unit test of the check. docs/argocd.md, "Fixtures", says what each scenario contributes.
#
#   bash hack/record-argocd-fixtures.sh [pytest args...]
#
# The recording is kept in $TRAINGUARD_RECORD_STATUSES (default .cache/argocd-statuses), emptied
# first. Needs what the e2e tier needs (hack/setup.sh, run first as hack/test.sh does).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
log() { printf '[record-argocd-fixtures] %s\n' "$*" >&2; }

recorded="${TRAINGUARD_RECORD_STATUSES:-$repo/.cache/argocd-statuses}"
rm -rf "$recorded"
mkdir -p "$recorded"

bash hack/setup.sh
# The operator scenarios run twice (as the cluster admin and with the chart's RBAC); one
# identity records the same statuses, so only the admin's run, plus the repeated-failure
# scenario on real trainer processes (chart identity only).
log "recording into $recorded"
TRAINGUARD_RECORD_STATUSES="$recorded" .venv/bin/pytest -p no:cacheprovider \
  tests/e2e/test_operator_pod.py \
  tests/e2e/test_operator_lifecycle.py \
  tests/e2e/test_operator_placement.py \
  tests/e2e/test_operator_ladder.py \
  tests/e2e/test_recovery_repeated.py \
  -k "admin or test_recovery_repeated" "$@"
log "$(find "$recorded" -name '*.yaml' | wc -l) cases recorded"

.venv/bin/python -m trainguard_dev.argocd_fixtures --recorded "$recorded" \
  --out charts/trainguard/argocd
.venv/bin/pytest -p no:cacheprovider -q tests/unit/test_argocd_health.py
log "review and commit charts/trainguard/argocd/testdata/ and health_test.yaml"
