#!/usr/bin/env bash
# Real Flux controllers beside the dev control plane (hack/controlplane.sh), for the GitOps tests
# (tests/flux.rs): Flux's source-controller and kustomize-controller built from their official Go
# modules, and a git server on localhost (`git http-backend` behind net/http/cgi) that serves
# bare repositories to source-controller over smart HTTP.
#
# usage: hack/flux.sh <command>
#   build [TOOL...]    build any missing binary (cached per wrapper-module version);
#                      TOOL is source-controller|kustomize-controller|git-http (default: all)
#   up                 start (or reuse) the three against the running dev control plane
#                      (KUBECONFIG, default: hack/controlplane.sh kubeconfig): installs Flux's
#                      CRDs and the namespace flux-system; prints the path of an env file
#                      (FLUX_GIT_ROOT, FLUX_GIT_URL, ...)
#   down               stop them
#   status             show them, their ports and health
#   bin-dir [TOOL]     print the binary directory of a tool
#
# The pinned versions and the build's workarounds are in the wrapper modules under hack/flux/
# (source-controller and kustomize-controller v1.9.6: v1.10 needs Go 1.27; their own replace
# directives repeated; github.com/fluxcd/pkg/artifact v0.18.3, which the Go module proxy
# refuses with 403, replaced by v0.18.0). A wrapper module requires the controller's module and
# `go build`s its main package, as hack/controlplane.sh does for Kubernetes: `go install
# MODULE@v1.9.6` refuses modules that carry replace directives.
#
# Environment:
#   MJ_CACHE_DIR       cache root (default ~/.cache/managed-jobs); binaries live under
#                      $MJ_CACHE_DIR/controlplane/bin/<tool>-<key>/ beside the control plane's,
#                      the running instance under $MJ_CACHE_DIR/controlplane/run/flux
#   KUBECONFIG         the cluster `up` starts Flux against (default: the dev control plane's)
#   MJ_LOCK_TIMEOUT    seconds to wait for the lock held by another up/down/build (default 900)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WRAPPERS="$ROOT/hack/flux"
CACHE="${MJ_CACHE_DIR:-$HOME/.cache/managed-jobs}/controlplane"
BIN_ROOT="$CACHE/bin"
RUN="$CACHE/run/flux"
LOCK_FILE="$CACHE/flux.lock"
NAMESPACE=flux-system

log() { printf '[flux] %s\n' "$*" >&2; }
die() { printf '[flux] error: %s\n' "$*" >&2; exit 1; }
now_ms() { date +%s%3N; }
elapsed() { # start_ms -> "12.3s"
  local ms=$(($(now_ms) - $1))
  printf '%d.%ds' $((ms / 1000)) $(((ms % 1000) / 100))
}

# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------

TOOLS=(source-controller kustomize-controller git-http)
tool_package() {
  case "$1" in
    source-controller) echo github.com/fluxcd/source-controller ;;
    kustomize-controller) echo github.com/fluxcd/kustomize-controller ;;
    git-http) echo . ;;
    *) die "unknown tool $1" ;;
  esac
}
# Version of the controller's module in its wrapper's go.mod (git-http: none).
tool_version() {
  [[ "$1" == git-http ]] && { echo local; return; }
  awk -v m="$(tool_package "$1")" '($1 == m && $2 ~ /^v/) { print $2; exit } ($1 == "require" && $2 == m) { print $3; exit }' \
    "$WRAPPERS/$1/go.mod"
}

BUILD_ENV="CGO_ENABLED=0"
BUILD_FLAGS="-trimpath"
BUILD_LDFLAGS="-s -w"

# Cache key: the wrapper module's files and the build flags.
tool_key() {
  local h
  h="$({ cat "$WRAPPERS/$1"/go.mod "$WRAPPERS/$1"/*.go
         [[ -f "$WRAPPERS/$1/go.sum" ]] && cat "$WRAPPERS/$1/go.sum"
         printf '%s\n%s\n%s\n%s\n' "$BUILD_ENV" "$BUILD_FLAGS" "$BUILD_LDFLAGS" "$(tool_package "$1")"
       } | sha256sum | cut -c1-12)"
  printf '%s-%s' "$1" "$h"
}
tool_bin_dir() { printf '%s/%s' "$BIN_ROOT" "$(tool_key "$1")"; }
bin_path() { printf '%s/%s' "$(tool_bin_dir "$1")" "$1"; }

# True when the tool's binary is absent or does not run: a cache copied from another machine
# (or cut short by a full disk) can hold a truncated binary, so each must answer --help (the
# controllers have no --version; --help prints their flags and exits 0).
tool_missing() {
  local b
  b="$(bin_path "$1")"
  [[ -x "$b" ]] || return 0
  if ! timeout 60 "$b" --help >/dev/null 2>&1; then
    log "cached $b does not run (truncated or corrupt?); rebuilding $1"
    return 0
  fi
  return 1
}

require_go() {
  command -v go >/dev/null 2>&1 || die "Go is not installed (Go >= 1.26 is needed to build Flux; see hack/controlplane.sh)"
  command -v git >/dev/null 2>&1 || die "git is not installed (the git server runs \`git http-backend\`)"
}

build_tool() {
  local t="$1" dir tmp start
  dir="$(tool_bin_dir "$t")"
  tmp="$BIN_ROOT/.tmp-$(tool_key "$t")-$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  log "building $t $(tool_version "$t") -> $dir"
  start="$(now_ms)"
  # shellcheck disable=SC2086
  if ! (cd "$WRAPPERS/$t" && env $BUILD_ENV GOFLAGS="${GOFLAGS:-} -mod=readonly" \
          go build $BUILD_FLAGS -ldflags "$BUILD_LDFLAGS" -o "$tmp/$t" "$(tool_package "$t")"); then
    rm -rf "$tmp"
    die "building $t failed (see the go output above)"
  fi
  rm -rf "$dir"; mv "$tmp" "$dir"
  local old
  for old in "$BIN_ROOT/$t"-*; do [[ "$old" == "$dir" ]] || rm -rf "$old"; done
  log "built $t in $(elapsed "$start")"
}

cmd_build() { # [TOOL...] (default: all)
  local t missing=() start wanted=("$@")
  ((${#wanted[@]})) || wanted=("${TOOLS[@]}")
  for t in "${wanted[@]}"; do
    [[ " ${TOOLS[*]} " == *" $t "* ]] || die "unknown tool '$t' (one of: ${TOOLS[*]})"
    tool_missing "$t" && missing+=("$t")
  done
  if ((${#missing[@]} == 0)); then
    log "Flux binaries cached under $BIN_ROOT"
    return 0
  fi
  require_go
  mkdir -p "$BIN_ROOT"
  start="$(now_ms)"
  for t in "${missing[@]}"; do build_tool "$t"; done
  log "build took $(elapsed "$start") (${missing[*]})"
}

# The controller's module source (for its CRDs), from the Go module cache.
module_dir() { # tool
  local dir
  dir="$(cd "$WRAPPERS/$1" && go list -m -f '{{.Dir}}' "$(tool_package "$1")" 2>/dev/null || true)"
  if [[ ! -d "$dir/config/crd/bases" ]]; then
    dir="$(cd "$WRAPPERS/$1" && go mod download -json "$(tool_package "$1")@$(tool_version "$1")" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  fi
  [[ -d "$dir/config/crd/bases" ]] || die "$(tool_package "$1") source not found in the Go module cache; run \`$0 build\`"
  printf '%s' "$dir"
}

# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------

COMPONENTS=(git-http source-controller kustomize-controller)
pid_file() { printf '%s/pids/%s.pid' "$RUN" "$1"; }

# The pid of a component if it is alive and still runs our binary (guards against pid reuse).
component_pid() {
  local pf pid
  pf="$(pid_file "$1")"
  [[ -f "$pf" ]] || return 1
  pid="$(<"$pf")"
  [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/cmdline" ]] || return 1
  local cmdline
  cmdline="$({ tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null)" || return 1
  grep -qxF -- "$(bin_path "$1")" <<<"$cmdline" || return 1
  printf '%s' "$pid"
}

start_component() { # name args...
  local name="$1"; shift
  mkdir -p "$RUN/logs" "$RUN/pids" "$RUN/tmp/$name"
  # setsid: own session, so the controllers outlive the shell (and test binary) that started
  # them; fd 9 (the lock) is closed. TMPDIR per controller (they unpack artifacts there).
  # shellcheck disable=SC2016 # expanded by the inner shell
  TMPDIR="$RUN/tmp/$name" setsid bash -c 'echo $$ >"$0"; exec "$@"' "$(pid_file "$name")" "$(bin_path "$name")" "$@" \
    >"$RUN/logs/$name.log" 2>&1 </dev/null 9>&- &
  local i
  for ((i = 0; i < 1500; i++)); do [[ -s "$(pid_file "$name")" ]] && return 0; sleep 0.02; done
  die "$name did not record its pid within 30 s"
}

stop_component() {
  local pid i
  if pid="$(component_pid "$1")"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do component_pid "$1" >/dev/null || break; sleep 0.1; done
    component_pid "$1" >/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$(pid_file "$1")"
}

free_ports() { # count -> space separated free loopback ports
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

port_of() { awk -v c="$1" '$1 == c { print $2 }' "$RUN/ports" 2>/dev/null; }
healthy() { # component
  case "$1" in
    # Any HTTP answer (git http-backend answers 404 for the root).
    git-http) [[ "$(curl -s --max-time 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(port_of git-http)/")" != 000 ]] ;;
    *) curl -sf --max-time 2 "http://127.0.0.1:$(port_of "$1-health")/readyz" >/dev/null ;;
  esac
}

wait_healthy() { # component timeout_s
  local deadline=$(($(date +%s) + $2))
  until healthy "$1"; do
    if ! component_pid "$1" >/dev/null; then
      log "$1 exited; last lines of $RUN/logs/$1.log:"; tail -n 25 "$RUN/logs/$1.log" >&2; exit 1
    fi
    if (($(date +%s) >= deadline)); then
      log "$1 not ready within $2 s; last lines of $RUN/logs/$1.log:"; tail -n 25 "$RUN/logs/$1.log" >&2; exit 1
    fi
    sleep 0.2
  done
}

kubeconfig() { printf '%s' "${KUBECONFIG:-$("$ROOT/hack/controlplane.sh" kubeconfig)}"; }
kc() { "$ROOT/hack/controlplane.sh" kubectl --kubeconfig "$(kubeconfig)" "$@"; }

# What the running instance was started for: the binaries and the cluster (its kubeconfig's
# contents change with each new control plane instance).
instance_key() {
  printf '%s %s %s %s' "$(tool_key source-controller)" "$(tool_key kustomize-controller)" "$(tool_key git-http)" \
    "$(sha256sum <"$(kubeconfig)" | cut -c1-12)"
}

running() {
  local c
  for c in "${COMPONENTS[@]}"; do component_pid "$c" >/dev/null && healthy "$c" || return 1; done
  [[ -f "$RUN/key" && "$(<"$RUN/key")" == "$(instance_key)" ]]
}

stop_all() {
  local i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop_component "${COMPONENTS[i]}"; done
  rm -rf "$RUN/pids" "$RUN/ports" "$RUN/key" "$RUN/env" "$RUN/storage" "$RUN/tmp"
}

cmd_up() {
  local start
  start="$(now_ms)"
  [[ -f "$(kubeconfig)" ]] || die "no kubeconfig at $(kubeconfig): start the control plane first (hack/controlplane.sh up)"
  cmd_build
  if running; then
    log "reusing the running Flux controllers ($(elapsed "$start"))"
    echo "$RUN/env"
    return 0
  fi
  stop_all
  mkdir -p "$RUN/git" "$RUN/storage" "$RUN/logs"
  # Flux's CRDs (server-side: they are large), then its namespace.
  local t
  for t in source-controller kustomize-controller; do
    kc apply --server-side --force-conflicts -f "$(module_dir "$t")/config/crd/bases/" >/dev/null
  done
  kc wait --for=condition=Established --timeout=60s crd/gitrepositories.source.toolkit.fluxcd.io \
    crd/kustomizations.kustomize.toolkit.fluxcd.io >/dev/null
  kc get namespace "$NAMESPACE" >/dev/null 2>&1 || kc create namespace "$NAMESPACE" >/dev/null

  local git sc_storage sc_metrics sc_health kc_metrics kc_health
  read -r git sc_storage sc_metrics sc_health kc_metrics kc_health <<<"$(free_ports 6)"
  printf 'git-http %s\nsource-controller-storage %s\nsource-controller-metrics %s\nsource-controller-health %s\nkustomize-controller-metrics %s\nkustomize-controller-health %s\n' \
    "$git" "$sc_storage" "$sc_metrics" "$sc_health" "$kc_metrics" "$kc_health" >"$RUN/ports"
  instance_key >"$RUN/key"
  local kcfg
  kcfg="$(kubeconfig)"

  start_component git-http -listen "127.0.0.1:$git" -root "$RUN/git"
  # Both watch every namespace (each test has its own); no leader election (one replica).
  KUBECONFIG="$kcfg" RUNTIME_NAMESPACE="$NAMESPACE" start_component source-controller \
    --storage-path="$RUN/storage" --storage-addr="127.0.0.1:$sc_storage" \
    --storage-adv-addr="127.0.0.1:$sc_storage" \
    --metrics-addr="127.0.0.1:$sc_metrics" --health-addr="127.0.0.1:$sc_health" \
    --log-encoding=console --events-addr=""
  KUBECONFIG="$kcfg" RUNTIME_NAMESPACE="$NAMESPACE" start_component kustomize-controller \
    --metrics-addr="127.0.0.1:$kc_metrics" --health-addr="127.0.0.1:$kc_health" \
    --log-encoding=console --events-addr="" --no-remote-bases=true
  for t in "${COMPONENTS[@]}"; do wait_healthy "$t" 60; done
  cat >"$RUN/env" <<EOF
FLUX_GIT_ROOT=$RUN/git
FLUX_GIT_URL=http://127.0.0.1:$git
FLUX_NAMESPACE=$NAMESPACE
FLUX_LOGS=$RUN/logs
EOF
  log "Flux up in $(elapsed "$start") (git http://127.0.0.1:$git, artifacts http://127.0.0.1:$sc_storage)"
  echo "$RUN/env"
}

cmd_status() {
  local c pid rc=0
  for c in "${COMPONENTS[@]}"; do
    if pid="$(component_pid "$c")"; then
      if healthy "$c"; then printf '%-22s running (pid %s), ready\n' "$c" "$pid"; else printf '%-22s running (pid %s), not ready\n' "$c" "$pid"; rc=1; fi
    else
      printf '%-22s not running\n' "$c"; rc=1
    fi
  done
  [[ -f "$RUN/ports" ]] && printf 'ports: %s\n' "$(tr '\n' ' ' <"$RUN/ports")"
  return "$rc"
}

with_lock() {
  mkdir -p "$CACHE"
  exec 9>"$LOCK_FILE"
  if ! flock -n 9; then
    log "waiting for another flux.sh (lock $LOCK_FILE)"
    flock -w "${MJ_LOCK_TIMEOUT:-900}" 9 || die "timed out waiting for $LOCK_FILE"
  fi
  "$@"
}

main() {
  local cmd="${1:-}"
  (($#)) && shift
  case "$cmd" in
    build) with_lock cmd_build "$@" ;;
    up) with_lock cmd_up ;;
    down) with_lock stop_all ;;
    status) cmd_status ;;
    bin-dir) tool_bin_dir "${1:-kustomize-controller}"; echo ;;
    -h | --help | help | "") sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" ;;
    *) die "unknown command '$cmd' (try --help)" ;;
  esac
}

main "$@"
