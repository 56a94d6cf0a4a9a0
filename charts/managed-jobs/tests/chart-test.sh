#!/usr/bin/env bash
# Checks of the managed-jobs chart, for CI and by hand:
#   1. the chart's copies of crds/ match (tests/crd-in-sync.sh), and the rendered CRD and finalizer
#      policy templates are those files plus only the chart's metadata labels/annotations, and
#      the users' roles those files renamed for the release;
#   2. `helm lint --strict` with the default values and with each ci/*-values.yaml;
#   3. `helm template | kubectl apply --dry-run=server` with the default values and each
#      ci/*-values.yaml, against the cluster in $KUBECONFIG (the API server validates every object,
#      the CRD included).
#
# usage: KUBECONFIG=... charts/managed-jobs/tests/chart-test.sh
#   In this repository: eval "$(hack/controlplane.sh env)" && charts/managed-jobs/tests/chart-test.sh
# Environment:
#   KUBECONFIG   cluster for the server-side dry runs (required)
#   HELM         helm binary (default: helm on PATH)
#   KUBECTL      kubectl binary (default: kubectl on PATH)
#   NAMESPACE    release namespace (default: mj-system)
# Namespaces the manifests need (the release namespace, a watchNamespace) are created when missing
# and deleted again at exit. A ServiceMonitor is dry-run only when the cluster has its CRD
# (monitoring.coreos.com); otherwise that run uses --set serviceMonitor.enabled=false and says so.
set -euo pipefail

CHART="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT="$(cd "$CHART/../.." && pwd)"
HELM="${HELM:-helm}"
KUBECTL="${KUBECTL:-kubectl}"
NAMESPACE="${NAMESPACE:-mj-system}"
RELEASE=t
: "${KUBECONFIG:?set KUBECONFIG to the cluster for the server-side dry runs}"
export KUBECONFIG

failures=0
step() { printf '\n=== %s\n' "$*"; }
pass() { printf 'PASS: %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; failures=$((failures + 1)); }

created_ns=()
cleanup() {
  for ns in "${created_ns[@]}"; do
    "$KUBECTL" delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT

ensure_ns() {
  local ns="$1"
  if ! "$KUBECTL" get namespace "$ns" >/dev/null 2>&1; then
    "$KUBECTL" create namespace "$ns" >/dev/null
    created_ns+=("$ns")
    echo "created namespace $ns (deleted at exit)"
  fi
}

# 1. CRD in sync.
step "CRD copy in sync with crds/"
if "$CHART/tests/crd-in-sync.sh"; then pass "crd-in-sync"; else fail "crd-in-sync"; fi

# Where the cluster serves MutatingAdmissionPolicy (Kubernetes 1.36+), render the finalizer policy
# as `helm install` would there; `helm template` alone does not know the API exists.
api_versions=()
if "$KUBECTL" api-resources --api-group=admissionregistration.k8s.io -o name 2>/dev/null |
  grep -q '^mutatingadmissionpolicies'; then
  api_versions=(--api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy)
fi

# Drop the document separators, the `# Source:` lines, and the labels/annotations block the
# template inserts between `metadata:` and `  name:`; what is left must be the file, byte for byte
# (document separators aside).
strip_chart_metadata() {
  awk '
    /^---$/ { next }
    /^# Source: / { next }
    /^metadata:$/ { print; inmeta = 1; next }
    inmeta && /^  name: / { inmeta = 0 }
    inmeta { next }
    { print }'
}
check_rendered() { # template file
  local template="$1" file="$2" rendered
  step "rendered $template = crds/$file + chart metadata"
  if rendered="$("$HELM" template "$RELEASE" "$CHART" -n "$NAMESPACE" "${api_versions[@]}" --show-only "$template")" &&
    diff -u <(grep -v '^---$' "$ROOT/crds/$file") <(printf '%s\n' "$rendered" | strip_chart_metadata); then
    pass "rendered $template"
  else
    fail "rendered $template differs from crds/$file"
  fi
}
check_rendered templates/crd.yaml managedjobs.dev_managedjobs.yaml
check_rendered templates/queue-crd.yaml managedjobs.dev_managedjobqueues.yaml
check_rendered templates/pool-crd.yaml managedjobs.dev_managedjobpools.yaml
check_rendered templates/shard-policy.yaml managedjobs.dev_shard-policy.yaml
check_rendered templates/gitops-policy.yaml managedjobs.dev_gitops-policy.yaml
if ((${#api_versions[@]} > 0)); then
  check_rendered templates/finalizer-policy.yaml managedjobs.dev_finalizer-policy.yaml
else
  echo "NOTE: the cluster does not serve MutatingAdmissionPolicy: the finalizer policy is not rendered"
fi

# Users' roles: the two files of crds/, with the release's names and the chart's labels.
step "rendered templates/user-roles.yaml = crds/managedjobs.dev_user-roles.yaml + crds/managedjobs.dev_visibility-access.yaml, renamed for the release + chart labels"
prefix="$NAMESPACE-$RELEASE-managed-jobs-"
if rendered="$("$HELM" template "$RELEASE" "$CHART" -n "$NAMESPACE" --show-only templates/user-roles.yaml)" &&
  diff -u <(cat "$ROOT/crds/managedjobs.dev_user-roles.yaml" "$ROOT/crds/managedjobs.dev_visibility-access.yaml" | grep -v '^---$') \
    <(printf '%s\n' "$rendered" | sed -e '/^---$/d' -e '/^# Source: /d' \
      -e '/^    helm\.sh\/chart: /d' \
      -e '/^    app\.kubernetes\.io\/\(name\|instance\|component\|version\|managed-by\): /d' \
      -e "s/^  name: $prefix/  name: managed-jobs-/"); then
  pass "rendered templates/user-roles.yaml"
else
  fail "rendered templates/user-roles.yaml differs from crds/"
fi

values_files=("")
for f in "$CHART"/ci/*-values.yaml; do values_files+=("$f"); done

# 2. Lint.
for f in "${values_files[@]}"; do
  label="${f:+${f#"$ROOT"/}}"; label="${label:-default values}"
  step "helm lint --strict ($label)"
  args=(lint --strict "$CHART")
  [[ -n "$f" ]] && args+=(-f "$f")
  if "$HELM" "${args[@]}"; then pass "lint ($label)"; else fail "lint ($label)"; fi
done

# 3. Template + server-side dry run.
have_servicemonitor=false
resources="$("$KUBECTL" api-resources --api-group=monitoring.coreos.com -o name 2>/dev/null || true)"
if grep -q '^servicemonitors' <<<"$resources"; then
  have_servicemonitor=true
fi
ensure_ns "$NAMESPACE"
for f in "${values_files[@]}"; do
  label="${f:+${f#"$ROOT"/}}"; label="${label:-default values}"
  step "helm template | kubectl apply --dry-run=server ($label)"
  # --skip-tests: the `helm test` Pod needs its ServiceAccount to exist, which a dry run does not
  # create; it runs for real in tests/real_node.rs.
  args=(template "$RELEASE" "$CHART" -n "$NAMESPACE" "${api_versions[@]}" --skip-tests)
  [[ -n "$f" ]] && args+=(-f "$f")
  if ! manifest="$("$HELM" "${args[@]}")"; then fail "template ($label)"; continue; fi
  if grep -q '^kind: ServiceMonitor$' <<<"$manifest" && [[ "$have_servicemonitor" != true ]]; then
    echo "NOTE: no ServiceMonitor CRD (monitoring.coreos.com) in this cluster:" \
      "dry-running with --set serviceMonitor.enabled=false"
    args+=(--set serviceMonitor.enabled=false)
    manifest="$("$HELM" "${args[@]}")"
  fi
  # Every namespace the manifests name must exist for a server-side dry run.
  while read -r ns; do ensure_ns "$ns"; done < <(
    sed -n 's/^  namespace: *//p' <<<"$manifest" | tr -d '"' | sort -u
  )
  if "$KUBECTL" apply --dry-run=server -f - <<<"$manifest"; then
    pass "dry-run ($label)"
  else
    fail "dry-run ($label)"
  fi
done

echo
if ((failures > 0)); then
  echo "chart-test: $failures check(s) failed" >&2
  exit 1
fi
echo "chart-test: all checks passed"
