#!/usr/bin/env bash
# Local Kubernetes control plane for tests and the demo, built from the official Go modules
# (no Docker): etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok
# (fake kubelets for fake nodes), plus matching kubectl and helm binaries; optionally a real
# kubelet node (containerd + runc, hack/realnode.sh) for the operator installed by its chart.
#
# usage: hack/controlplane.sh <command>
#   build [TOOL...]    build any missing binary (cached per wrapper-module version);
#                      TOOL is kubernetes|etcd|kwok|helm|kubelet|coredns (default: all)
#   up [--nodes N] [--real-node] [--gang-scheduling]
#                      start (or reuse a healthy) control plane with N kwok nodes (default 4);
#                      --real-node adds (or reuses) the real kubelet node `mj-real-node`
#                      (root only; installs containerd, runc, buildah and the CNI plugins from
#                      Debian packages when missing; see hack/realnode.sh);
#                      --gang-scheduling turns on kube-scheduler's gang scheduling: the alpha
#                      feature gates GenericWorkload and GangScheduling on the API server,
#                      scheduler and controller manager, and the API group
#                      scheduling.k8s.io/v1alpha2 (Workload, PodGroup). A running instance
#                      without it is replaced; one with it is reused by a plain `up`
#   down               stop everything (the real node first) and remove the instance's data
#   kill-apiserver     SIGKILL the instance's kube-apiserver (an API outage, for fault tests;
#                      give them an instance of their own: MJ_CACHE_DIR)
#   start-apiserver    start it again as it was, and wait until it is ready
#   load-image FILE... import image archives (docker-archive) into the real node's containerd
#   status             show components, ports, health and nodes
#   kubeconfig         print the kubeconfig path
#   env                print `export KUBECONFIG=...` (and PATH with the matching kubectl/helm)
#   kubectl ARGS...    run the matching kubectl against the control plane
#   helm ARGS...       run the matching helm against the control plane
#   bin-dir [TOOL]     print the binary directory of kubernetes|etcd|kwok|helm|kubelet
#
# Environment:
#   MJ_CACHE_DIR       cache root (default ~/.cache/managed-jobs); binaries live under
#                      $MJ_CACHE_DIR/controlplane/bin/<key>/, the instance under .../controlplane/run
#   MJ_NODES           default node count for `up` (default 4)
#   MJ_REAL_NODE=1     `up` adds the real node as with --real-node
#   MJ_GANG_SCHEDULING=1  `up` turns on gang scheduling as with --gang-scheduling
#   MJ_MIN_FREE_GB     free disk required before a build (default 10)
#   MJ_LOCK_TIMEOUT    seconds to wait for the lock held by another up/down/build (default 900)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WRAPPERS="$ROOT/hack/controlplane"
STAGES_DIR="$ROOT/hack/stages"
CACHE="${MJ_CACHE_DIR:-$HOME/.cache/managed-jobs}/controlplane"
BIN_ROOT="$CACHE/bin"
RUN="$CACHE/run"
KUBECONFIG_PATH="$RUN/kubeconfig"
LOCK_FILE="$CACHE/controlplane.lock"
MIN_FREE_GB="${MJ_MIN_FREE_GB:-10}"

# Components in start order; stopped in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { printf '[controlplane] %s\n' "$*" >&2; }
die() { printf '[controlplane] error: %s\n' "$*" >&2; exit 1; }
now_ms() { date +%s%3N; }
elapsed() { # start_ms -> "12.3s"
  local ms=$(($(now_ms) - $1))
  printf '%d.%ds' $((ms / 1000)) $(((ms % 1000) / 100))
}

# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------

# Tool -> packages and binaries built from its wrapper module.
tool_packages() {
  case "$1" in
    kubernetes) echo "k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl" ;;
    etcd) echo "go.etcd.io/etcd/server/v3" ;;
    kwok) echo "sigs.k8s.io/kwok/cmd/kwok" ;;
    helm) echo "helm.sh/helm/v3/cmd/helm" ;;
    kubelet) echo "k8s.io/kubernetes/cmd/kubelet" ;;
    coredns) echo "managedjobs.dev/hack/controlplane/coredns" ;;
    *) die "unknown tool $1" ;;
  esac
}
tool_binaries() {
  case "$1" in
    kubernetes) echo "kube-apiserver kube-controller-manager kube-scheduler kubectl" ;;
    etcd) echo "etcd" ;;
    kwok) echo "kwok" ;;
    helm) echo "helm" ;;
    kubelet) echo "kubelet" ;;
    coredns) echo "coredns" ;;
    *) die "unknown tool $1" ;;
  esac
}
# coredns: the real node's cluster DNS (a multi-node job's ranks reach each other by name).
TOOLS=(kubernetes etcd kwok helm kubelet coredns)
# The wrapper module a tool is built from: the kubelet comes from the control plane's own
# Kubernetes module (same version, same dependency pins).
tool_wrapper() { if [[ "$1" == kubelet ]]; then echo kubernetes; else echo "$1"; fi; }

# Version of the main module a wrapper requires, read from its go.mod.
tool_version() {
  local mod
  case "$1" in
    kubernetes | kubelet) mod=k8s.io/kubernetes ;;
    etcd) mod=go.etcd.io/etcd/server/v3 ;;
    kwok) mod=sigs.k8s.io/kwok ;;
    helm) mod=helm.sh/helm/v3 ;;
    coredns) mod=github.com/coredns/coredns ;;
  esac
  awk -v m="$mod" '($1 == m && $2 ~ /^v/) { print $2; exit } ($1 == "require" && $2 == m) { print $3; exit }' \
    "$WRAPPERS/$(tool_wrapper "$1")/go.mod"
}

tool_ldflags() {
  local flags="-s -w"
  if [[ "$1" == kubernetes || "$1" == kubelet ]]; then
    local v major minor p
    v="$(tool_version kubernetes)"
    [[ "$v" =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "cannot parse k8s.io/kubernetes version '$v'"
    major="${BASH_REMATCH[1]}" minor="${BASH_REMATCH[2]}"
    # Without these the binaries report v0.0.0-master+$Format:%H$, which kubectl cannot parse.
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      flags+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
  elif [[ "$1" == helm ]]; then
    flags+=" -X helm.sh/helm/v3/internal/version.version=$(tool_version helm)"
  fi
  printf '%s' "$flags"
}

BUILD_ENV="CGO_ENABLED=0"
BUILD_FLAGS="-trimpath"

# Cache key: wrapper go.mod + go.sum contents and the build flags.
tool_key() {
  local h
  # coredns is built from a main package of its own wrapper (the plugins it links): its source
  # is part of the key.
  h="$({ cat "$WRAPPERS/$(tool_wrapper "$1")/go.mod" "$WRAPPERS/$(tool_wrapper "$1")/go.sum"
         if [[ "$1" == coredns ]]; then cat "$WRAPPERS/coredns/main.go"; fi
         printf '%s\n%s\n%s\n%s\n' "$BUILD_ENV" "$BUILD_FLAGS" "$(tool_ldflags "$1")" "$(tool_packages "$1")"
       } | sha256sum | cut -c1-12)"
  printf '%s-%s' "$1" "$h"
}
tool_bin_dir() { printf '%s/%s' "$BIN_ROOT" "$(tool_key "$1")"; }
bin_path() { # binary name -> path
  local t b
  for t in "${TOOLS[@]}"; do
    for b in $(tool_binaries "$t"); do
      [[ "$b" == "$1" ]] && { printf '%s/%s' "$(tool_bin_dir "$t")" "$b"; return; }
    done
  done
  die "unknown binary $1"
}

# The command that proves a cached binary runs (prints its version and exits 0).
version_args() {
  case "$1" in
    kubectl) echo "version --client" ;;
    helm) echo "version" ;;
    coredns) echo "-version" ;;
    *) echo "--version" ;;
  esac
}

# True when a binary of the tool is absent or does not run. A cache copied from another machine
# (or cut short by a full disk) can hold a truncated binary that dies with no output at all, so
# every cached binary must print its version before it is trusted.
tool_missing() {
  local dir b
  dir="$(tool_bin_dir "$1")"
  for b in $(tool_binaries "$1"); do
    [[ -x "$dir/$b" ]] || return 0
    # shellcheck disable=SC2046 # version_args is a word list
    if ! timeout 60 "$dir/$b" $(version_args "$b") >/dev/null 2>&1; then
      log "cached $dir/$b does not run (truncated or corrupt?); rebuilding $1"
      return 0
    fi
  done
  return 1
}

require_go() {
  command -v go >/dev/null 2>&1 || die "Go is not installed (Go >= 1.26 is needed to build the control plane).
  Install it from https://go.dev/dl/ , e.g.:
    curl -fsSLO https://go.dev/dl/go1.26.8.linux-amd64.tar.gz && sudo tar -C /usr/local -xzf go1.26.8.linux-amd64.tar.gz
    export PATH=\$PATH:/usr/local/go/bin"
}

free_gb() { df -P -k "$1" | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }

check_disk() {
  local d gb gomodcache gocache
  gomodcache="$(go env GOMODCACHE)"; gocache="$(go env GOCACHE)"
  for d in "$CACHE" "$gomodcache" "$gocache"; do
    mkdir -p "$d"
    gb="$(free_gb "$d")"
    if (( gb < MIN_FREE_GB )); then
      die "only ${gb} GB free on the filesystem holding $d; building the control plane needs about ${MIN_FREE_GB} GB (Go module cache ~2 GB, build cache ~5 GB, binaries ~0.5 GB). Free some space (e.g. \`go clean -cache\`) or set MJ_MIN_FREE_GB to override."
    fi
  done
}

build_tool() {
  local t="$1" dir tmp pkgs start
  dir="$(tool_bin_dir "$t")"
  pkgs="$(tool_packages "$t")"
  tmp="$BIN_ROOT/.tmp-$(tool_key "$t")-$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  log "building $t $(tool_version "$t") -> $dir"
  start="$(now_ms)"
  # shellcheck disable=SC2086
  if ! (cd "$WRAPPERS/$(tool_wrapper "$t")" && env $BUILD_ENV GOFLAGS="${GOFLAGS:-} -mod=readonly" \
          go build $BUILD_FLAGS -ldflags "$(tool_ldflags "$t")" -o "$tmp/" $pkgs); then
    rm -rf "$tmp"
    die "building $t failed (see the go output above)"
  fi
  # go.etcd.io/etcd/server/v3 builds a binary named after its last path element.
  if [[ "$t" == etcd && ! -f "$tmp/etcd" ]]; then
    local f
    for f in "$tmp"/*; do mv "$f" "$tmp/etcd"; done
  fi
  rm -rf "$dir"; mv "$tmp" "$dir"
  # Drop binaries of other versions of this tool (a running instance keeps its open files).
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
    log "all binaries cached under $BIN_ROOT"
    return 0
  fi
  require_go
  check_disk
  start="$(now_ms)"
  for t in "${missing[@]}"; do build_tool "$t"; done
  log "build took $(elapsed "$start") (${missing[*]})"
}

# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------

pid_file() { printf '%s/pids/%s.pid' "$RUN" "$1"; }
cmd_file() { printf '%s/pids/%s.bin' "$RUN" "$1"; }

# Prints the pid of a component if its process is alive AND is really our binary
# (guards against pid reuse: /proc/PID/cmdline must contain the binary path we started).
component_pid() {
  local pf cf pid bin
  pf="$(pid_file "$1")"; cf="$(cmd_file "$1")"
  [[ -f "$pf" && -f "$cf" ]] || return 1
  pid="$(<"$pf")"; bin="$(<"$cf")"
  [[ "$pid" =~ ^[0-9]+$ && -r "/proc/$pid/cmdline" ]] || return 1
  local cmdline
  # The process may exit between the test above and this read; braces keep the shell quiet.
  cmdline="$({ tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null)" || return 1
  grep -qxF -- "$bin" <<<"$cmdline" || return 1
  printf '%s' "$pid"
}

start_component() { # name binary args...
  local name="$1" bin="$2"; shift 2
  mkdir -p "$RUN/logs" "$RUN/pids"
  printf '%s' "$bin" >"$(cmd_file "$name")"
  # setsid: own session, so the instance outlives the shell (and test binary) that started it.
  # The inner shell records its own pid and execs the binary (same pid). fd 9 (the flock) is
  # closed so the components do not keep holding the lock.
  # shellcheck disable=SC2016 # expanded by the inner shell
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$(pid_file "$name")" "$bin" "$@" \
    >"$RUN/logs/$name.log" 2>&1 </dev/null 9>&- &
  LAUNCHED[$name]=$!
  # A loaded machine can take a while to fork; wait up to 30 s for the pid file.
  local i
  for ((i = 0; i < 1500; i++)); do [[ -s "$(pid_file "$name")" ]] && return 0; sleep 0.02; done
  die_with_logs "$name" "$name did not record its pid within 30 s"
}
declare -A LAUNCHED=() # component -> pid of the process this script started

stop_component() {
  local name="$1" pid i
  if pid="$(component_pid "$name")"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do # ~10 s
      if [[ ! -d "/proc/$pid" ]] || ! component_pid "$name" >/dev/null; then break; fi
      sleep 0.1
    done
    if component_pid "$name" >/dev/null; then
      log "$name (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do [[ -d "/proc/$pid" ]] || break; sleep 0.1; done
    fi
  fi
  rm -f "$(pid_file "$name")" "$(cmd_file "$name")"
}

stop_all() {
  local i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop_component "${COMPONENTS[i]}"; done
  # Keep logs/ for post-mortems; everything else belongs to the dead instance.
  rm -rf "$RUN/data" "$RUN/pki" "$RUN/pids" "$RUN/kwok-home" "$RUN/ports" "$RUN/key" "$RUN/features" "$KUBECONFIG_PATH"
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

# ---------------------------------------------------------------------------------------------
# Certificates and kubeconfig
# ---------------------------------------------------------------------------------------------

gen_pki() {
  local p="$RUN/pki"
  mkdir -p "$p"
  (
    cd "$p"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt \
      -subj "/CN=managed-jobs-dev-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    cat >apiserver.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1
EOF
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    cat >admin.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EOF
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=admin" 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile admin.ext -out admin.crt 2>/dev/null
    # The API server's client certificate towards kubelets (logs, exec, port-forward): a real
    # node's kubelet refuses anonymous requests and authorizes this identity.
    openssl req -newkey rsa:2048 -nodes -keyout apiserver-kubelet-client.key -out apiserver-kubelet-client.csr \
      -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
    openssl x509 -req -in apiserver-kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile admin.ext -out apiserver-kubelet-client.crt 2>/dev/null
    # The front proxy (kube-aggregator) towards aggregated API servers, such as the operator's
    # visibility API: its own CA, which those servers read from the
    # kube-system/extension-apiserver-authentication ConfigMap to trust the X-Remote-User header.
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout front-proxy-ca.key -out front-proxy-ca.crt \
      -subj "/CN=managed-jobs-dev-front-proxy-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr \
      -subj "/CN=front-proxy-client" 2>/dev/null
    openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial \
      -days 3650 -extfile admin.ext -out front-proxy-client.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.srl
  )
}

write_kubeconfig() { # port
  local p="$RUN/pki" tmp="$KUBECONFIG_PATH.tmp"
  (
    umask 077
    cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: managed-jobs-dev
  cluster:
    server: https://127.0.0.1:$1
    certificate-authority-data: $(base64 -w0 <"$p/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(base64 -w0 <"$p/admin.crt")
    client-key-data: $(base64 -w0 <"$p/admin.key")
contexts:
- name: managed-jobs-dev
  context:
    cluster: managed-jobs-dev
    user: admin
    namespace: default
current-context: managed-jobs-dev
EOF
  )
  mv "$tmp" "$KUBECONFIG_PATH"
}

# ---------------------------------------------------------------------------------------------
# Health
# ---------------------------------------------------------------------------------------------

api_get() { # path -> body; fails unless HTTP 2xx
  local port
  port="$(awk '/^apiserver /{print $2}' "$RUN/ports" 2>/dev/null)"
  [[ -n "$port" ]] || return 1
  curl -sf --max-time 3 --cacert "$RUN/pki/ca.crt" --cert "$RUN/pki/admin.crt" --key "$RUN/pki/admin.key" \
    "https://127.0.0.1:$port$1"
}

wait_for() { # description timeout_s command...
  local what="$1" timeout="$2"; shift 2
  local deadline=$(($(date +%s) + timeout))
  local seen
  until seen="$("$@" 2>&1)"; do
    if (($(date +%s) >= deadline)); then
      log "timed out after ${timeout}s waiting for $what (check: $*); its last output: ${seen:-nothing}"
      return 1
    fi
    sleep 0.2
  done
}

etcd_healthy() {
  local port
  port="$(awk '/^etcd /{print $2}' "$RUN/ports")"
  local health
  health="$(curl -sf --max-time 2 "http://127.0.0.1:$port/health")" || return 1
  grep -q '"health":"true"' <<<"$health"
}
apiserver_ready() { [[ "$(api_get /readyz)" == ok ]]; }
default_ns_exists() { api_get /api/v1/namespaces/default >/dev/null; }

# Bump INSTANCE_LAYOUT when the components' flags or certificates change, so that `up` replaces an
# instance started by an older version of this script.
INSTANCE_LAYOUT=3
instance_key() { printf '%s %s %s %s' "$(tool_key kubernetes)" "$(tool_key etcd)" "$(tool_key kwok)" "$INSTANCE_LAYOUT"; }

# 0 = healthy running instance, 1 = nothing there, 2 = stale (something left over, not healthy)
instance_state() {
  local c alive=0 dead=0
  for c in "${COMPONENTS[@]}"; do
    if component_pid "$c" >/dev/null; then alive=$((alive + 1)); elif [[ -f "$(pid_file "$c")" ]]; then dead=$((dead + 1)); fi
  done
  if ((alive == 0 && dead == 0)); then
    [[ -d "$RUN/pids" || -d "$RUN/data" ]] && return 2
    return 1
  fi
  ((alive == ${#COMPONENTS[@]})) || return 2
  [[ -f "$RUN/key" && "$(<"$RUN/key")" == "$(instance_key)" ]] || { log "binaries changed since the running instance started"; return 2; }
  apiserver_ready || return 2
  # An instance without the gang-scheduling gates cannot serve a caller that asks for them (the
  # gates are fixed at start); one with them serves every caller.
  if [[ "${WANT_GANG:-0}" == 1 && "$(cat "$RUN/features" 2>/dev/null)" != gang-scheduling ]]; then
    log "the running instance has no gang scheduling; replacing it"
    return 2
  fi
  return 0
}

# The feature gates of the API server, scheduler and controller manager ($1: 1 for gang
# scheduling: KEP-4671's GenericWorkload, the Workload and PodGroup API, and GangScheduling,
# the scheduler plugin that binds a PodGroup's Pods all or nothing).
feature_args() {
  [[ "$1" == 1 ]] && printf '%s' "--feature-gates=GenericWorkload=true,GangScheduling=true"
  return 0
}

# Like wait_for, but gives up at once when the component's process has exited.
wait_component() { # component description timeout_s command...
  local c="$1" what="$2" timeout="$3"; shift 3
  local deadline=$(($(date +%s) + timeout))
  local seen
  until seen="$("$@" 2>&1)"; do
    component_pid "$c" >/dev/null || die_with_logs "$c" "$c exited while waiting for $what"
    (($(date +%s) < deadline)) || die_with_logs "$c" "timed out after ${timeout}s waiting for $what (check: $*); its last output: ${seen:-nothing}"
    sleep 0.2
  done
}

die_with_logs() { # component message
  log "$2"
  local pid="${LAUNCHED[$1]:-}" rc
  if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
    rc=0; wait "$pid" 2>/dev/null || rc=$?
    if ((rc > 128)); then
      log "$1 (pid $pid) was killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
    else
      log "$1 (pid $pid) exited with status $rc"
    fi
  fi
  if [[ -s "$RUN/logs/$1.log" ]]; then
    log "last lines of $RUN/logs/$1.log:"
    tail -n 25 "$RUN/logs/$1.log" >&2
  else
    log "$RUN/logs/$1.log is empty"
  fi
  exit 1
}

# ---------------------------------------------------------------------------------------------
# Cluster contents: kwok CRDs, Stages, Nodes
# ---------------------------------------------------------------------------------------------

kc() { "$(bin_path kubectl)" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

kwok_module_dir() {
  local v dir modcache
  v="$(tool_version kwok)"
  if command -v go >/dev/null 2>&1; then modcache="$(go env GOMODCACHE)"; else modcache="${GOMODCACHE:-${GOPATH:-$HOME/go}/pkg/mod}"; fi
  dir="$modcache/sigs.k8s.io/kwok@$v"
  if [[ ! -d "$dir/kustomize/crd/bases" ]] && command -v go >/dev/null 2>&1; then
    dir="$(cd "$WRAPPERS/kwok" && go mod download -json "sigs.k8s.io/kwok@$v" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  fi
  [[ -d "$dir/kustomize/crd/bases" ]] || die "kwok module source (sigs.k8s.io/kwok@$v) not found in the Go module cache; run \`$0 build\` with Go installed"
  printf '%s' "$dir"
}

# All kwok CRDs (only Stage is enabled in kwok, the others are installed so their kinds exist).
install_kwok_crds() {
  local dir
  dir="$(kwok_module_dir)"
  kc apply --server-side --force-conflicts -f "$dir/kustomize/crd/bases/" >/dev/null
  kc wait --for=condition=Established --timeout=60s -f "$dir/kustomize/crd/bases/" >/dev/null
  wait_for "discovery of kwok.x-k8s.io/v1alpha1 stages" 30 stages_discoverable
}
stages_discoverable() {
  local resources
  resources="$(api_get /apis/kwok.x-k8s.io/v1alpha1)" || return 1
  grep -qE '"name": ?"stages"' <<<"$resources"
}

apply_stages() {
  local f args=()
  for f in "$STAGES_DIR"/*.yaml; do args+=(-f "$f"); done
  kc apply "${args[@]}" >/dev/null
}

ensure_nodes() { # count
  local n="$1" i manifest=""
  for ((i = 0; i < n; i++)); do
    manifest+="---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: \"0\"
  labels:
    type: kwok
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: kwok-node-$i
    node-role.kubernetes.io/agent: \"\"
spec:
  podCIDR: 10.244.$i.0/24
  podCIDRs:
  - 10.244.$i.0/24
status:
  addresses:
  - type: InternalIP
    address: 10.240.0.$((i + 10))
  - type: Hostname
    address: kwok-node-$i
  allocatable:
    cpu: \"8\"
    memory: 32Gi
    pods: \"110\"
  capacity:
    cpu: \"8\"
    memory: 32Gi
    pods: \"110\"
"
  done
  printf '%s' "$manifest" | kc apply -f - >/dev/null
}

nodes_ready() { # count: Ready and without the not-ready/unreachable taints
  local n="$1" out
  out="$(kc get nodes -l type=kwok -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.conditions[?(@.type=="Ready")].status}{" "}{.spec.taints[*].key}{"\n"}{end}')"
  local i line
  for ((i = 0; i < n; i++)); do
    line="$(grep -E "^kwok-node-$i " <<<"$out")" || return 1
    [[ "$line" == "kwok-node-$i True"* && "$line" != *node.kubernetes.io/not-ready* && "$line" != *node.kubernetes.io/unreachable* ]] || return 1
  done
}

# ---------------------------------------------------------------------------------------------
# up / down
# ---------------------------------------------------------------------------------------------

cmd_up() {
  local nodes="${MJ_NODES:-4}" real_node="${MJ_REAL_NODE:-0}"
  WANT_GANG="${MJ_GANG_SCHEDULING:-0}"
  while (($#)); do
    case "$1" in
      --real-node) real_node=1; shift ;;
      --gang-scheduling) WANT_GANG=1; shift ;;
      --nodes) [[ $# -ge 2 ]] || die "--nodes needs a value"; nodes="$2"; shift 2 ;;
      --nodes=*) nodes="${1#--nodes=}"; shift ;;
      *) die "unknown argument to up: $1" ;;
    esac
  done
  [[ "$nodes" =~ ^[0-9]+$ ]] || die "--nodes must be a number"
  ((nodes <= 250)) || die "--nodes must be at most 250"

  local start state=0
  start="$(now_ms)"
  cmd_build kubernetes etcd kwok
  [[ "$real_node" == 1 ]] && cmd_build kubelet coredns

  instance_state || state=$?
  if ((state == 0)); then
    apply_stages
    ensure_nodes "$nodes"
    wait_for "$nodes kwok nodes Ready" 60 nodes_ready "$nodes" || die_with_logs kwok "nodes did not become Ready"
    log "reusing the running control plane ($(elapsed "$start"))"
    [[ "$real_node" == 1 ]] && realnode up
    echo "$KUBECONFIG_PATH"
    return 0
  fi
  if ((state == 2)); then
    log "found a stale or unhealthy instance; stopping it and cleaning up"
    realnode down || true
    stop_all
  fi

  # A start that fails for a passing reason (a port taken between choosing and binding it, a
  # component killed under memory pressure) is tried once more from scratch. Each try is a new
  # process so that `set -e` holds inside it.
  local try rc
  for try in 1 2; do
    rc=0
    bash "${BASH_SOURCE[0]}" __start-instance "$nodes" "$start" "$WANT_GANG" >/dev/null || rc=$?
    if ((rc == 0)); then
      [[ "$real_node" == 1 ]] && realnode up
      echo "$KUBECONFIG_PATH"
      return 0
    fi
    ((try == 1)) && log "start failed (status $rc); trying once more with fresh ports and data"
  done
  die "the control plane did not start twice in a row (logs: $RUN/logs)"
}

# Starts a new instance (the caller holds the lock and has cleaned up); prints the kubeconfig path.
# kube-apiserver, on the instance's ports and certificates ($RUN/ports, $RUN/pki) and with its
# feature gates ($RUN/features); waits for /readyz. It fronts aggregated API servers (the front
# proxy's certificate and the X-Remote-* headers) and dials their endpoints directly
# (--enable-aggregator-routing): there is no kube-proxy to route a Service's cluster IP.
start_apiserver() {
  local etcd_port api_port p="$RUN/pki" gang=0 features
  [[ "$(cat "$RUN/features" 2>/dev/null)" == gang-scheduling ]] && gang=1
  features="$(feature_args "$gang")"
  etcd_port="$(awk '/^etcd /{print $2}' "$RUN/ports")"
  api_port="$(awk '/^apiserver /{print $2}' "$RUN/ports")"
  start_component kube-apiserver "$(bin_path kube-apiserver)" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
    --client-ca-file="$p/ca.crt" \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --api-audiences=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range=10.96.0.0/16 \
    --authorization-mode=Node,RBAC \
    --allow-privileged=true --endpoint-reconciler-type=none \
    --cert-dir="$RUN/data/apiserver-certs" \
    --kubelet-client-certificate="$p/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$p/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --requestheader-client-ca-file="$p/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-uid-headers=X-Remote-Uid \
    --requestheader-group-headers=X-Remote-Group --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$p/front-proxy-client.crt" --proxy-client-key-file="$p/front-proxy-client.key" \
    --enable-aggregator-routing=true \
    ${features:+"$features" --runtime-config=scheduling.k8s.io/v1alpha2=true}
  wait_component kube-apiserver "kube-apiserver /readyz" 60 apiserver_ready
}

# An API server outage (fault tests): SIGKILL kube-apiserver as a crash would, and wait until it
# is gone; the other components stay up and retry against it.
cmd_kill_apiserver() {
  local pid i
  pid="$(component_pid kube-apiserver)" || die "no running kube-apiserver in this instance ($RUN)"
  kill -KILL "$pid"
  for ((i = 0; i < 100; i++)); do [[ -d "/proc/$pid" ]] || break; sleep 0.1; done
  [[ ! -d "/proc/$pid" ]] || die "kube-apiserver (pid $pid) outlived SIGKILL for 10 s"
  rm -f "$(pid_file kube-apiserver)" "$(cmd_file kube-apiserver)"
  log "kube-apiserver (pid $pid) killed"
}

# The end of the outage: starts kube-apiserver again, as it was, and waits until it is ready.
cmd_start_apiserver() {
  local start
  start="$(now_ms)"
  [[ -f "$RUN/ports" && -d "$RUN/pki" ]] || die "no instance here ($RUN): run up first"
  if component_pid kube-apiserver >/dev/null; then
    log "kube-apiserver runs already"
    return 0
  fi
  component_pid etcd >/dev/null || die "etcd is not running: the instance is gone (run up)"
  start_apiserver
  log "kube-apiserver ready again in $(elapsed "$start")"
}

start_instance() { # nodes start_ms gang(0|1)
  local nodes="$1" start="$2" gang="${3:-0}" features
  # A failed start must not leave half an instance behind (the logs are kept).
  trap 'rc=$?; if ((rc != 0)); then log "up failed; stopping the partial instance (logs: $RUN/logs)"; stop_all; fi' EXIT
  rm -rf "$RUN/data" "$RUN/pki" "$RUN/pids" "$RUN/kwok-home"
  mkdir -p "$RUN/data" "$RUN/logs" "$RUN/pids" "$RUN/kwok-home"
  gen_pki
  local ports etcd_port peer_port api_port
  ports="$(free_ports 3)"
  read -r etcd_port peer_port api_port <<<"$ports"
  printf 'etcd %s\netcd-peer %s\napiserver %s\n' "$etcd_port" "$peer_port" "$api_port" >"$RUN/ports"
  write_kubeconfig "$api_port"
  instance_key >"$RUN/key"
  features="$(feature_args "$gang")"
  if [[ "$gang" == 1 ]]; then echo gang-scheduling >"$RUN/features"; else rm -f "$RUN/features"; fi
  local p="$RUN/pki"

  start_component etcd "$(bin_path etcd)" \
    --name=managed-jobs-dev --data-dir="$RUN/data/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-cluster="managed-jobs-dev=http://127.0.0.1:$peer_port" \
    --unsafe-no-fsync=true --log-level=warn
  wait_component etcd "etcd /health" 30 etcd_healthy

  start_apiserver
  wait_component kube-apiserver "the default namespace" 30 default_ns_exists

  install_kwok_crds
  apply_stages

  start_component kube-controller-manager "$(bin_path kube-controller-manager)" \
    --kubeconfig="$KUBECONFIG_PATH" --leader-elect=false \
    --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
    --bind-address=127.0.0.1 --secure-port=0 ${features:+"$features"}
  start_component kube-scheduler "$(bin_path kube-scheduler)" \
    --kubeconfig="$KUBECONFIG_PATH" --leader-elect=false --bind-address=127.0.0.1 --secure-port=0 \
    ${features:+"$features"}
  # HOME is redirected so a developer's ~/.kwok/kwok.yaml cannot change the behaviour.
  HOME="$RUN/kwok-home" start_component kwok "$(bin_path kwok)" \
    --kubeconfig="$KUBECONFIG_PATH" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --enable-crds=Stage --node-lease-duration-seconds=40 --cidr=10.244.0.0/16

  ensure_nodes "$nodes"
  local c
  for c in kube-controller-manager kube-scheduler kwok; do
    component_pid "$c" >/dev/null || die_with_logs "$c" "$c exited right after start"
  done
  wait_component kwok "$nodes kwok nodes Ready" 60 nodes_ready "$nodes"
  trap - EXIT
  log "control plane up in $(elapsed "$start") (apiserver https://127.0.0.1:$api_port, $nodes nodes${features:+, gang scheduling})"
}

# hack/realnode.sh with what it needs to know of this instance.
realnode() {
  RUN="$RUN" CACHE="$CACHE" KUBECONFIG_PATH="$KUBECONFIG_PATH" KUBECTL_BIN="$(bin_path kubectl)" \
    KUBELET_BIN="$(bin_path kubelet)" COREDNS_BIN="$(bin_path coredns)" bash "$ROOT/hack/realnode.sh" "$@"
}

cmd_down() {
  local start
  start="$(now_ms)"
  realnode down
  stop_all
  log "control plane stopped in $(elapsed "$start")"
}

cmd_status() {
  local c pid rc=0
  for c in "${COMPONENTS[@]}"; do
    if pid="$(component_pid "$c")"; then
      printf '%-24s running (pid %s)\n' "$c" "$pid"
    else
      printf '%-24s not running\n' "$c"; rc=1
    fi
  done
  if [[ -f "$RUN/ports" ]]; then
    printf 'ports: %s\n' "$(tr '\n' ' ' <"$RUN/ports")"
  fi
  [[ -f "$RUN/features" ]] && printf 'features: %s\n' "$(<"$RUN/features")"
  if apiserver_ready 2>/dev/null; then
    echo "apiserver /readyz: ok"
    echo "kubeconfig: $KUBECONFIG_PATH"
    kc get nodes -o wide 2>/dev/null || true
    [[ -d "$RUN/realnode/pids" ]] && { echo "real node:"; realnode status || true; }
  else
    echo "apiserver /readyz: not ready"; rc=1
  fi
  return "$rc"
}

with_lock() {
  mkdir -p "$CACHE"
  exec 9>"$LOCK_FILE"
  if ! flock -n 9; then
    log "waiting for another controlplane.sh (lock $LOCK_FILE)"
    flock -w "${MJ_LOCK_TIMEOUT:-900}" 9 || die "timed out waiting for $LOCK_FILE"
  fi
  "$@"
}

main() {
  local cmd="${1:-}"
  (($#)) && shift
  case "$cmd" in
    build) with_lock cmd_build "$@" ;;
    up) with_lock cmd_up "$@" ;;
    down) with_lock cmd_down "$@" ;;
    status) cmd_status ;;
    kubeconfig) echo "$KUBECONFIG_PATH" ;;
    env)
      echo "export KUBECONFIG=$KUBECONFIG_PATH"
      echo "export PATH=$(tool_bin_dir kubernetes):$(tool_bin_dir helm):\$PATH"
      ;;
    load-image) with_lock realnode load "$@" ;;
    kill-apiserver) with_lock cmd_kill_apiserver ;;
    start-apiserver) with_lock cmd_start_apiserver ;;
    kubectl) exec "$(bin_path kubectl)" --kubeconfig "$KUBECONFIG_PATH" "$@" ;;
    helm) exec "$(bin_path helm)" --kubeconfig "$KUBECONFIG_PATH" "$@" ;;
    bin-dir) tool_bin_dir "${1:-kubernetes}"; echo ;;
    __start-instance) start_instance "$@" ;; # internal: one try of `up` (see cmd_up)
    -h | --help | help | "") sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" ;;
    *) die "unknown command '$cmd' (try --help)" ;;
  esac
}

main "$@"
