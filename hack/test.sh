#!/usr/bin/env bash
# Runs every test of the project: unit, property, engine (real processes and SQLite) and the
# integration tests against the real dev control plane (kube-apiserver, etcd, kube-scheduler,
# kube-controller-manager, kwok), real Flux controllers (hack/flux.sh), the dashboard in a real
# headless Chromium (Debian's, installed when missing), and, as root, the
# operator image installed by its chart on the control plane's real kubelet node (containerd and
# runc from Debian packages, installed when missing). The first run builds the control plane and
# Flux from the official Go modules (about 15 + 11 minutes on 2 cores; cached per user
# afterwards) and the release binary for the image.
#
# The control plane runs with kube-scheduler's gang scheduling on (`up --gang-scheduling`):
# tests/gangs.rs checks multi-node jobs with PodGroups, and without them by the operator's
# `--gang-scheduling off`.
#
# usage: hack/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

start=$(date +%s)
hack/controlplane.sh build kubernetes etcd kwok helm kubelet coredns
# Flux's source-controller and kustomize-controller for tests/flux.rs (about 11 min cold, cached).
hack/flux.sh build
# The previous release for the backward-compatibility tests (tests/upgrade.rs and the chart form
# in tests/real_node.rs): a debug build of hack/previous-release's commit, cached by it (about
# 5 min cold).
hack/previous-release.sh build
# A real headless browser for the dashboard's tests (tests/visibility.rs, tests/real_node.rs):
# Debian's Chromium, installed when missing (as root; otherwise those tests skip, or fail under
# CI=true).
if [[ ! -x /usr/bin/chromium ]]; then
  if [[ $EUID == 0 ]]; then
    echo "[test] installing chromium (the dashboard's tests)" >&2
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; then
      echo "[test] installing chromium failed; the dashboard's tests will fail under CI=true" >&2
    fi
  else
    echo "[test] not root and no /usr/bin/chromium: the dashboard's tests will skip (or fail under CI=true)" >&2
  fi
fi
was_running=0
if hack/controlplane.sh status >/dev/null 2>&1; then was_running=1; fi
if [[ $was_running == 0 ]]; then
  trap 'hack/flux.sh down >/dev/null 2>&1 || true; hack/controlplane.sh down >/dev/null 2>&1 || true' EXIT
fi
# The real kubelet node and the operator image for tests/real_node.rs (root only). When either
# cannot be had, the other tests still run; the real-node tests then skip, or fail under CI=true.
real_node=0
if [[ $EUID == 0 ]]; then
  if MJ_KUBECONFIG="$(hack/controlplane.sh up --real-node --gang-scheduling)"; then
    real_node=1
  else
    echo "[test] the real node did not start (logs: ~/.cache/managed-jobs/controlplane/run/realnode/logs)" >&2
  fi
else
  echo "[test] not root: no real node; tests/real_node.rs will skip (or fail under CI=true)" >&2
fi
if [[ $real_node == 0 ]]; then
  MJ_KUBECONFIG="$(hack/controlplane.sh up --gang-scheduling)"
fi
export MJ_KUBECONFIG
echo "[test] control plane ready after $(( $(date +%s) - start )) s; kubeconfig $MJ_KUBECONFIG" >&2
if [[ $real_node == 1 ]]; then
  image_start=$(date +%s)
  if hack/image.sh --load >/dev/null; then
    echo "[test] operator image built and loaded in $(( $(date +%s) - image_start )) s" >&2
  else
    echo "[test] building the operator image failed; tests/real_node.rs will fail under CI=true" >&2
  fi
  # The previous release's image, for the chart form of the backward-compatibility test.
  if hack/previous-release.sh image &&
    hack/controlplane.sh load-image "$(hack/previous-release.sh dir)/image.tar"; then
    echo "[test] the previous release's image is loaded" >&2
  else
    echo "[test] the previous release's image could not be built or loaded; its upgrade test will fail under CI=true" >&2
  fi
fi
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
# Each failed test's panic, together at the end (the whole output is long; its tail is what
# a CI summary shows).
if ((failed)); then
  echo
  echo "what each failed test said:"
  # awk reads to the end (no early exit under pipefail); grep finds nothing only if the panic
  # text changed.
  grep -A2 -E "^thread '.*' \([0-9]+\) panicked at|^thread '.*' panicked at" "$log" | cut -c1-600 | awk 'NR <= 80' || true
fi
rm -f "$log" "$MJ_SKIPPED_FILE"
echo
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit "$status"
