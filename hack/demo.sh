#!/usr/bin/env bash
# The demo: the dev control plane up, the ManagedJob CRD installed, the operator running with the
# local executor and small caps (launch 2, run 4) so queueing shows, the examples applied, and
# their progress printed until every job has finished (the long one is cancelled on the way).
#
# usage: hack/demo.sh            (first run builds the control plane: about 15 minutes)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

NS=managed-jobs-demo
k() { hack/controlplane.sh kubectl "$@"; }

echo "==> building the control plane (cached after the first run) and starting it" >&2
hack/controlplane.sh build kubernetes etcd kwok
KUBECONFIG="$(hack/controlplane.sh up)"
export KUBECONFIG

echo "==> building managed-jobs" >&2
cargo build --locked --quiet
BIN="${CARGO_TARGET_DIR:-target}/debug/managed-jobs"

echo "==> installing the CRD" >&2
k apply -f crds/ >/dev/null
k wait --for=condition=Established crd/managedjobs.managedjobs.dev --timeout=60s >/dev/null
k create namespace "$NS" --dry-run=client -o yaml | k apply -f - >/dev/null
# A moment after Established, the API still refuses creates of the new kind (ServiceUnavailable:
# the finalizer policy, a MutatingAdmissionPolicy, cannot type it yet): wait until a server-side
# dry run of a create passes.
for i in $(seq 150); do
  k -n "$NS" apply --dry-run=server -f examples/hello.yaml >/dev/null 2>&1 && break
  if ((i == 150)); then k -n "$NS" apply --dry-run=server -f examples/hello.yaml; exit 1; fi
  sleep 0.2
done

STATE="${MJ_CACHE_DIR:-$HOME/.cache/managed-jobs}/demo-state"
rm -rf "$STATE" && mkdir -p "$STATE"
echo "==> starting the operator (state dir $STATE, log $STATE/operator.log)" >&2
"$BIN" run --state-dir "$STATE" --namespace "$NS" --executors local,pod \
  --launch-cap 2 --run-cap 4 >"$STATE/operator.log" 2>&1 &
OP=$!
trap 'kill $OP 2>/dev/null || true; wait $OP 2>/dev/null || true' EXIT
sleep 1
kill -0 "$OP" 2>/dev/null || { cat "$STATE/operator.log"; exit 1; }
# A previous demo's jobs: the running operator releases their finalizers.
k -n "$NS" delete managedjobs --all --wait=true --timeout=60s >/dev/null 2>&1 || true

echo "==> applying examples/hello.yaml, failing.yaml, long.yaml, batch.yaml (20 jobs), pod-hello.yaml, pod-failing.yaml, pipeline.yaml and pod-pipeline.yaml" >&2
for f in hello failing long batch pod-hello pod-failing pipeline pod-pipeline; do k -n "$NS" apply -f "examples/$f.yaml" >/dev/null; done

terminal='Succeeded|Failed|FailedSetup|FailedPrecheck|FailedNoResource|FailedController|Cancelled'
cancelled=0
for _ in $(seq 1 150); do
  clear 2>/dev/null || true
  echo "managed-jobs demo: kubectl -n $NS get managedjobs   ($(date +%T))"
  k -n "$NS" get managedjobs -o wide
  echo
  # The whole table is read, then its head printed (`queue | head` under pipefail fails when
  # head exits first).
  table="$("$BIN" queue --state-dir "$STATE")"
  head -4 <<<"$table"
  phases=$(k -n "$NS" get managedjobs -o jsonpath='{range .items[*]}{.metadata.name}={.status.phase}{"\n"}{end}')
  if [[ $cancelled == 0 ]] && grep -q '^long-running=Running$' <<<"$phases"; then
    echo; echo "==> cancelling long-running: kubectl patch mj long-running --type merge -p '{\"spec\":{\"cancel\":true}}'"
    k -n "$NS" patch managedjob long-running --type merge -p '{"spec":{"cancel":true}}' >/dev/null
    cancelled=1
  fi
  total=$(grep -c . <<<"$phases" || true)
  finished=$(grep -cE "=($terminal)$" <<<"$phases" || true)
  if [[ $total -gt 0 && $finished == "$total" ]]; then
    echo; echo "==> all $total jobs finished"
    "$BIN" queue --state-dir "$STATE" --all --tasks
    echo; echo "==> $BIN logs $NS/pipeline --state-dir $STATE"
    "$BIN" logs "$NS/pipeline" --state-dir "$STATE"
    echo; echo "logs: $BIN logs $NS/hello --state-dir $STATE   (add --controller for the job controller's log, --task NAME for one task of a pipeline)"
    echo "stop the control plane with: hack/controlplane.sh down"
    exit 0
  fi
  sleep 2
done
echo "the demo did not finish in time; operator log: $STATE/operator.log" >&2
exit 1
