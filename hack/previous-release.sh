#!/usr/bin/env bash
# The previous release, for the backward-compatibility test (tests/upgrade.rs): jobs started by
# it must end under this checkout's build as they would have without the upgrade. Which release
# that is: hack/previous-release (its tag and commit; the commit is what is built, so the test
# needs no tags in the clone). Built once and cached beside the control plane's binaries, keyed
# by the commit, as SkyPilot's tests/backward_compatibility_tests.sh builds its previous release.
#
# usage: hack/previous-release.sh <command>
#   build        build what is missing of the sources (`git archive` of the commit) and the
#                debug binary
#   image        build (once) the release's operator image from that binary (`hack/image.sh
#                --binary`, tagged managed-jobs:<version>, a docker-archive); needs buildah,
#                podman or docker (the real node's setup installs buildah)
#   dir          print the release's cache directory; it holds
#                  src/            the release's sources (its chart, CRDs, examples)
#                  managed-jobs    its binary (a debug build: a release build of an old version
#                                  would cost CI 5-20 min for nothing the test reads)
#                  image.tar       its image (docker-archive), tagged managed-jobs:<version>
#                  version         its version (Cargo.toml)
#   version      print its version
#
# Environment:
#   MJ_CACHE_DIR   cache root (default ~/.cache/managed-jobs); the release lives under
#                  $MJ_CACHE_DIR/controlplane/bin/release-<tag>-<commit>/, its cargo target dir
#                  under $MJ_CACHE_DIR/controlplane/bin/release-target/
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${MJ_CACHE_DIR:-$HOME/.cache/managed-jobs}/controlplane/bin"

log() { printf '[previous-release] %s\n' "$*" >&2; }
die() { printf '[previous-release] error: %s\n' "$*" >&2; exit 1; }

read_release() {
  local line
  line="$(grep -v '^#' "$ROOT/hack/previous-release" | grep -v '^[[:space:]]*$' || true)"
  read -r TAG COMMIT <<<"$line"
  [[ -n "${TAG:-}" && "${COMMIT:-}" =~ ^[0-9a-f]{40}$ ]] ||
    die "hack/previous-release must hold one line 'TAG COMMIT' (a full commit hash); it holds: ${line:-nothing}"
  DIR="$CACHE/release-$TAG-${COMMIT:0:12}"
}

# The binary is trusted only if it runs and says its version.
binary_ok() { [[ -x "$DIR/managed-jobs" && -s "$DIR/version" ]] && "$DIR/managed-jobs" --version >/dev/null 2>&1; }

cmd_build() {
  read_release
  if binary_ok; then
    log "cached: $TAG ($COMMIT) in $DIR"
    return 0
  fi
  git -C "$ROOT" cat-file -e "$COMMIT^{commit}" 2>/dev/null ||
    die "commit $COMMIT ($TAG) is not in this clone's history (a shallow clone?); fetch it: git fetch --unshallow"
  local start=$SECONDS tmp="$DIR.tmp-$$"
  rm -rf "$tmp"
  mkdir -p "$tmp/src"
  # The sources as committed: no worktree to register or remove.
  git -C "$ROOT" archive --format=tar "$COMMIT" >"$tmp/src.tar"
  tar -xf "$tmp/src.tar" -C "$tmp/src"
  rm -f "$tmp/src.tar"
  local version
  version="$(awk -F'"' '/^version *=/ { print $2; exit }' "$tmp/src/Cargo.toml")"
  [[ -n "$version" ]] || die "no version in $TAG's Cargo.toml"
  printf '%s\n' "$version" >"$tmp/version"
  log "building $TAG ($COMMIT, version $version): cargo build (debug), cold about 5 min"
  (cd "$tmp/src" && CARGO_TARGET_DIR="$CACHE/release-target" cargo build --locked --bin managed-jobs >&2) ||
    die "building $TAG failed"
  cp "$CACHE/release-target/debug/managed-jobs" "$tmp/managed-jobs"
  "$tmp/managed-jobs" --version >/dev/null || die "the binary built from $TAG does not run"
  rm -rf "$DIR"
  mv "$tmp" "$DIR"
  log "built $TAG in $((SECONDS - start)) s: $DIR"
}

cmd_image() {
  cmd_build
  if [[ -s "$DIR/image.tar" ]]; then
    log "cached: the image of $TAG, $DIR/image.tar"
    return 0
  fi
  local start=$SECONDS version
  version="$(<"$DIR/version")"
  # The image carries a stripped copy: the debug info is most of a debug build's size.
  strip -o "$DIR/managed-jobs.stripped" "$DIR/managed-jobs"
  "$ROOT/hack/image.sh" --binary "$DIR/managed-jobs.stripped" --tag "managed-jobs:$version" \
    --archive "$DIR/image.tar.tmp" >/dev/null || die "building $TAG's image failed"
  rm -f "$DIR/managed-jobs.stripped"
  mv "$DIR/image.tar.tmp" "$DIR/image.tar"
  log "built the image managed-jobs:$version of $TAG in $((SECONDS - start)) s: $DIR/image.tar"
}

case "${1:-}" in
  build) cmd_build ;;
  image) cmd_image ;;
  dir) read_release; printf '%s\n' "$DIR" ;;
  version) read_release; binary_ok || die "$TAG is not built: hack/previous-release.sh build"; cat "$DIR/version" ;;
  *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
