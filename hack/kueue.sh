#!/usr/bin/env bash
# Kueue, the peer of `bench --scenario shares` (BENCHMARKS.md, issue 44): its manager built from
# its official Go module (`go install`, a few minutes cold, then cached) and its CRDs from the
# same module. Only the benchmark uses it; no test does.
#
# usage: hack/kueue.sh <command>
#   build    build the manager when missing; prints the binary's path
#   crds     download the module when missing; prints the directory of its CRDs
#
# Environment:
#   MJ_CACHE_DIR   cache root (default ~/.cache/managed-jobs); the binary lives under
#                  $MJ_CACHE_DIR/kueue-<version>/bin
set -euo pipefail

VERSION=v0.17.0
MODULE=sigs.k8s.io/kueue
CACHE="${MJ_CACHE_DIR:-$HOME/.cache/managed-jobs}/kueue-$VERSION"

log() { printf '[kueue] %s\n' "$*" >&2; }

case "${1:-}" in
  build)
    if [[ ! -x "$CACHE/bin/kueue" ]]; then
      log "building $MODULE/cmd/kueue@$VERSION (a few minutes)"
      GOBIN="$CACHE/bin" CGO_ENABLED=0 GOFLAGS=-mod=mod \
        go install -trimpath -ldflags "-s -w" "$MODULE/cmd/kueue@$VERSION"
    fi
    echo "$CACHE/bin/kueue"
    ;;
  crds)
    dir="$(go env GOMODCACHE)/$MODULE@$VERSION/config/components/crd/bases"
    if [[ ! -d "$dir" ]]; then
      go mod download "$MODULE@$VERSION" >&2
    fi
    [[ -d "$dir" ]] || { log "no CRDs at $dir"; exit 1; }
    echo "$dir"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
