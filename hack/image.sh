#!/usr/bin/env bash
# Builds the operator image from the repository's Dockerfile, without a registry:
#   1. cargo build --release --locked --bin managed-jobs (or --binary FILE)
#   2. target/image/<tag>/rootfs: the binary, the shared libraries `ldd` lists and the loader, an
#      /etc/passwd with nonroot (65532), /tmp (see the Dockerfile)
#   3. `buildah bud` (or `podman build`, or `docker build`: the first one found) of the Dockerfile
#      with target/image/<tag> as the context, tagged managed-jobs:<version> (Cargo.toml's; or --tag)
#
# usage: hack/image.sh [--tag NAME] [--binary FILE] [--archive FILE] [--load]
#   --tag NAME      image name (default managed-jobs:<version>, the chart's appVersion, i.e.
#                   docker.io/library/managed-jobs:<version>)
#   --binary FILE   put FILE in the image instead of building the release binary (the
#                   backward-compatibility test's previous release: hack/previous-release.sh)
#   --archive FILE  also write the image as a docker-archive to FILE
#   --load          import it into the dev control plane's real node (hack/controlplane.sh
#                   load-image), with the archive at target/image/<tag>/managed-jobs.tar unless --archive
# Prints the image's name, then its size, on stderr; the archive path (if any) on stdout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

version="$(awk -F'"' '/^version *=/ { print $2; exit }' "$ROOT/Cargo.toml")"
tag="managed-jobs:$version" archive="" load=0 binary=""
while (($#)); do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --archive) archive="$2"; shift 2 ;;
    --load) load=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }

start=$SECONDS
if [[ -n "$binary" ]]; then
  bin="$binary"
  [[ -x "$bin" ]] || die "no executable at $bin (--binary)"
else
  cargo build --release --locked --bin managed-jobs >&2
  bin="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/managed-jobs"
  [[ -x "$bin" ]] || die "no binary at $bin"
  log "binary built in $((SECONDS - start)) s ($(du -h "$bin" | cut -f1))"
fi

# One build context per tag: two images may be built one after another (the previous release's
# and this one's) without one's files in the other.
ctx="$ROOT/target/image/$(tr '/:' '__' <<<"$tag")"
rootfs="$ctx/rootfs"
rm -rf "$rootfs"
mkdir -p "$rootfs/etc" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
cp "$bin" "$rootfs/managed-jobs"
# Every shared library the binary loads, and the loader, at the paths it looks for them.
while read -r path; do
  [[ -n "$path" ]] || continue
  mkdir -p "$rootfs$(dirname "$path")"
  cp -L "$path" "$rootfs$path"
done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
[[ -n "$(find "$rootfs" -name 'ld-linux*')" ]] || die "ldd listed no dynamic loader for $bin"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
# A shell is never in the image: the local executor is off in-cluster (see the chart's README).

if command -v buildah >/dev/null 2>&1; then
  # vfs: works on any filesystem and needs no fuse-overlayfs.
  builder=(env STORAGE_DRIVER=vfs buildah --storage-driver vfs bud --layers=false)
  export_cmd=(env STORAGE_DRIVER=vfs buildah --storage-driver vfs push -q "$tag")
  size_cmd=(env STORAGE_DRIVER=vfs buildah --storage-driver vfs images --format '{{.Size}}' "$tag")
elif command -v podman >/dev/null 2>&1; then
  builder=(podman build)
  export_cmd=(podman push -q "$tag")
  size_cmd=(podman images --format '{{.Size}}' "$tag")
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  builder=(docker build)
  export_cmd=()
  size_cmd=(docker images --format '{{.Size}}' "$tag")
else
  die "none of buildah, podman or a running docker found (Debian: apt-get install buildah)"
fi
"${builder[@]}" -q -f "$ROOT/Dockerfile" -t "$tag" "$ctx" >/dev/null
# Earlier builds of the tag are left untagged: drop them.
if [[ "${builder[*]}" == *buildah* ]]; then
  env STORAGE_DRIVER=vfs buildah --storage-driver vfs rmi --prune >/dev/null 2>&1 || true
fi
size="$("${size_cmd[@]}" 2>/dev/null || true)"
log "built $tag in $((SECONDS - start)) s: ${size%%$'\n'*}"

if ((load)) && [[ -z "$archive" ]]; then archive="$ctx/managed-jobs.tar"; fi
if [[ -n "$archive" ]]; then
  if ((${#export_cmd[@]})); then
    rm -f "$archive"
    "${export_cmd[@]}" "docker-archive:$archive:$tag" >/dev/null
  else
    docker save -o "$archive" "$tag"
  fi
  log "archive $archive ($(du -h "$archive" | cut -f1))"
  echo "$archive"
fi
if ((load)); then
  "$ROOT/hack/controlplane.sh" load-image "$archive"
  log "imported $tag into the real node"
fi
