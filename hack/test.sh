#!/usr/bin/env bash
# Runs every test of the project: unit, property, engine (real processes and SQLite) and the
# integration tests against the real dev control plane (kube-apiserver, etcd, kube-scheduler,
# kube-controller-manager, kwok). The first run builds the control plane from the official Go
# modules (about 15 minutes on 2 cores; cached per user afterwards).
#
# usage: hack/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

start=$(date +%s)
hack/controlplane.sh build kubernetes etcd kwok helm
was_running=0
if hack/controlplane.sh status >/dev/null 2>&1; then was_running=1; fi
MJ_KUBECONFIG="$(hack/controlplane.sh up)"
export MJ_KUBECONFIG
if [[ $was_running == 0 ]]; then
  trap 'hack/controlplane.sh down >/dev/null 2>&1 || true' EXIT
fi
echo "[test] control plane ready after $(( $(date +%s) - start )) s; kubeconfig $MJ_KUBECONFIG" >&2
log="$(mktemp)"
# Each integration test that skips (no control plane) appends a line here; see tests/support.
MJ_SKIPPED_FILE="$(mktemp)"
export MJ_SKIPPED_FILE
set +e
cargo test --locked --all-targets --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed=$(grep -oE 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -oE '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')
skipped=$(wc -l < "$MJ_SKIPPED_FILE" | tr -d ' ')
rm -f "$log" "$MJ_SKIPPED_FILE"
echo
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit "$status"
