#!/usr/bin/env bash
# A real kubelet node beside the dev control plane (hack/controlplane.sh up --real-node): a
# kubelet built from the control plane's own Kubernetes module, containerd + runc + the CNI
# plugins from Debian packages, registered as node `mj-real-node` with the label
# managedjobs.dev/real-node=true and the taint managedjobs.dev/real-node=true:NoSchedule (kwok
# workloads never land on it; Pods meant for it tolerate the taint).
#
# Called by hack/controlplane.sh with the control plane up (it holds the control plane's lock):
#   up       install missing packages, start containerd and the kubelet, import the images
#            (pause, busybox), wait for the node to be Ready, offer 3 hostPath volumes
#   down     delete the node's Pods, stop the kubelet, every container and containerd, unmount
#            and remove what `up` added to the host (mounts, cgroups, the bridge, the iptables
#            chain, network namespaces, sysctls the kubelet changed)
#   status   print whether the node's processes run
#   load F   import the image archive F into the node's containerd (hack/image.sh --load)
#
# Host layout, all removed by `down`:
#   /var/lib/mj-realnode/{containerd,kubelet,pod-logs,cni-ipam}   data
#   /run/mj-realnode/containerd (containerd's state and socket)
#   bridge mj-cni0 10.123.0.1/24 (the node's InternalIP; Pods get 10.123.0.10-250)
#   iptables nat chain MJ-REALNODE: Pods reach the API server at 10.96.0.1:443 (the `kubernetes`
#   Service) by a DNAT to the loopback API server port, with route_localnet on the bridge
#   cluster DNS: CoreDNS (built from its Go module, hack/controlplane/coredns) on 10.123.0.1:53
#   with the kubernetes plugin (Services; a headless Service's Pods by hostname.subdomain, as a
#   multi-node job's ranks use them) and the host's resolver for the rest; the kubelet gives it
#   to Pods as their nameserver (clusterDNS, clusterDomain cluster.local)
#   $RUN/realnode: configs, certificates, pids, logs (logs are kept)
#
# One real node per machine: the control plane instance that set it up owns it
# ($DATA/owner); another instance's `down` leaves it alone and its `up --real-node` is refused
# while the owner runs it. `up` on the owning instance repairs what stopped (a killed kubelet or
# containerd) keeping the node's images, volumes and Pods; it sets the node up anew only for a
# new control plane (another API server port or CA). Volumes whose claim was deleted are wiped
# and offered again.
#
# Security: the kubelet serves on the bridge address only, refuses anonymous requests and asks
# the API server (SubjectAccessReview) about every client certificate it is shown; the API
# server authenticates to it with its kubelet client certificate (hack/controlplane.sh).
#
# Needs root (mounts, network, cgroups). Facts and walls: see the project's docs on the real node.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${RUN:?RUN, the run dir of the control plane, must be set by hack/controlplane.sh}"
: "${KUBECONFIG_PATH:?}"
: "${KUBECTL_BIN:?}"
: "${KUBELET_BIN:?}"
: "${COREDNS_BIN:?}"
CACHE="${CACHE:-${MJ_CACHE_DIR:-$HOME/.cache/managed-jobs}/controlplane}"

NODE_NAME=mj-real-node
NODE_LABEL=managedjobs.dev/real-node
NR="$RUN/realnode"
DATA=/var/lib/mj-realnode
STATE=/run/mj-realnode
CTRD_SOCK="$STATE/containerd/containerd.sock"
BRIDGE=mj-cni0
SUBNET=10.123.0.0/24
NODE_IP=10.123.0.1
SERVICE_IP=10.96.0.1
CHAIN=MJ-REALNODE
SANDBOX_IMAGE=registry.k8s.io/pause:3.10
BUSYBOX_IMAGE=docker.io/library/busybox:1.36
PACKAGES=(containerd runc buildah busybox-static iptables containernetworking-plugins iproute2 gcc libc6-dev)

log() { printf '[realnode] %s\n' "$*" >&2; }
die() { printf '[realnode] error: %s\n' "$*" >&2; exit 1; }
kc() { "$KUBECTL_BIN" --kubeconfig "$KUBECONFIG_PATH" "$@"; }
ctr_() { ctr -a "$CTRD_SOCK" -n k8s.io "$@"; }

# True when containerd lists image NAME. The whole listing is read first (a `ctr | grep -q`
# pipeline under pipefail fails when grep exits before ctr has written everything); the
# listing is left in $IMAGES_SEEN for the caller's error message.
IMAGES_SEEN=""
image_present() { # name
  IMAGES_SEEN="$(ctr_ images ls -q 2>&1)" || return 1
  grep -qxF -- "$1" <<<"$IMAGES_SEEN"
}

pid_alive() { # name -> 0 when its recorded process runs our binary
  local pf="$NR/pids/$1.pid" pid
  [[ -f "$pf" ]] || return 1
  pid="$(<"$pf")"
  [[ "$pid" =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  local cmdline
  cmdline="$({ tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null)" || return 1
  grep -qxF -- "$(<"$NR/pids/$1.bin")" <<<"$cmdline"
}

start_daemon() { # name binary args...
  local name="$1" bin="$2"; shift 2
  mkdir -p "$NR/logs" "$NR/pids"
  printf '%s' "$bin" >"$NR/pids/$name.bin"
  # shellcheck disable=SC2016 # expanded by the inner shell
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$NR/pids/$name.pid" "$bin" "$@" \
    >"$NR/logs/$name.log" 2>&1 </dev/null 9>&- &
  local i
  for ((i = 0; i < 500; i++)); do [[ -s "$NR/pids/$name.pid" ]] && return 0; sleep 0.02; done
  die "$name did not start"
}

stop_daemon() { # name [seconds before SIGKILL]
  local name="$1" wait="${2:-10}" pid i
  if pid_alive "$name"; then
    pid="$(<"$NR/pids/$name.pid")"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < wait * 10; i++)); do pid_alive "$name" || break; sleep 0.1; done
    if pid_alive "$name"; then
      log "$name ignored SIGTERM for ${wait}s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
    fi
  fi
  rm -f "$NR/pids/$name.pid" "$NR/pids/$name.bin"
}

wait_until() { # description timeout_s command...
  local what="$1" timeout="$2"; shift 2
  local deadline=$(($(date +%s) + timeout))
  local seen
  until seen="$("$@" 2>&1)"; do
    (($(date +%s) < deadline)) || { log "timed out after ${timeout}s waiting for $what (check: $*); its last output: ${seen:-nothing}"; return 1; }
    sleep 0.2
  done
}

tail_log() { [[ -s "$NR/logs/$1.log" ]] && { log "last lines of $NR/logs/$1.log:"; tail -n 30 "$NR/logs/$1.log" >&2; }; return 0; }

# ---------------------------------------------------------------------------------------------
# Packages and images
# ---------------------------------------------------------------------------------------------

ensure_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  [[ $EUID == 0 ]] || die "the real node needs these Debian packages: ${missing[*]} (install them as root)"
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# buildah without a registry or daemon: vfs storage works on any filesystem.
buildah_() { STORAGE_DRIVER=vfs buildah --storage-driver vfs "$@"; }

# Builds an image from a root filesystem folder and writes it as a docker-archive (the format
# containerd imports with its name); cached by the folder's content.
image_archive() { # name rootfs-dir entrypoint-json -> prints the archive path
  local name="$1" dir="$2" entrypoint="$3" key out c
  key="$( (echo "$entrypoint"; cd "$dir" && find . -printf '%p %m %l\n' | sort && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-12)"
  out="$CACHE/images/$(tr '/:' '__' <<<"$name")-$key.tar"
  if [[ ! -s "$out" ]]; then
    mkdir -p "$CACHE/images"
    c="$(buildah_ from scratch)"
    buildah_ copy "$c" "$dir" / >/dev/null
    buildah_ config --entrypoint "$entrypoint" --cmd '[]' "$c" >/dev/null
    buildah_ commit -q "$c" "$name" >/dev/null
    buildah_ rm "$c" >/dev/null
    rm -f "$out.tmp"
    buildah_ push -q "$name" "docker-archive:$out.tmp:$name" >/dev/null
    buildah_ rmi "$name" >/dev/null 2>&1 || true
    mv "$out.tmp" "$out"
  fi
  printf '%s' "$out"
}

# The sandbox image: a static pause program (hack/realnode/pause.c).
pause_archive() {
  local dir="$NR/images/pause"
  rm -rf "$dir"; mkdir -p "$dir"
  gcc -static -O2 -o "$dir/pause" "$ROOT/hack/realnode/pause.c"
  strip "$dir/pause"
  image_archive "$SANDBOX_IMAGE" "$dir" '["/pause"]'
}

# busybox:1.36 for the examples' Pods, from Debian's busybox-static (1.35: the applets the
# examples use are the same). Every applet is a link to /bin/busybox.
busybox_archive() {
  local dir="$NR/images/busybox" a
  rm -rf "$dir"; mkdir -p "$dir/bin" "$dir/tmp" "$dir/etc"
  chmod 1777 "$dir/tmp"
  cp /bin/busybox "$dir/bin/busybox"
  for a in $(/bin/busybox --list); do [[ "$a" == busybox ]] || ln -sf busybox "$dir/bin/$a"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$dir/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$dir/etc/group"
  image_archive "$BUSYBOX_IMAGE" "$dir" '[]'
}

cmd_load() { # archive...
  local f
  for f in "$@"; do
    [[ -s "$f" ]] || die "no image archive at $f"
    ctr_ images import --no-unpack=false "$f" >/dev/null || die "importing $f into the node's containerd failed"
  done
}

# ---------------------------------------------------------------------------------------------
# Certificates and configuration
# ---------------------------------------------------------------------------------------------

gen_node_pki() {
  local p="$RUN/pki" d="$NR/pki"
  mkdir -p "$d"
  (
    cd "$d"
    umask 077
    cat >client.ext <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EOF
    cat >serving.ext <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME
EOF
    openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out c.csr \
      -subj "/O=system:nodes/CN=system:node:$NODE_NAME" 2>/dev/null
    openssl x509 -req -in c.csr -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 3650 \
      -extfile client.ext -out kubelet-client.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout kubelet.key -out s.csr -subj "/CN=$NODE_NAME" 2>/dev/null
    openssl x509 -req -in s.csr -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 3650 \
      -extfile serving.ext -out kubelet.crt 2>/dev/null
    rm -f ./*.csr ./*.srl "$p"/*.srl
  )
}

api_port() { awk '/^apiserver /{print $2}' "$RUN/ports"; }

write_configs() { # kubelet_port healthz_port
  local p="$RUN/pki" d="$NR/pki"
  mkdir -p "$NR/cni"
  cat >"$NR/containerd.toml" <<EOF
version = 2
root = "$DATA/containerd"
state = "$STATE/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$SANDBOX_IMAGE"
  # containerd gives sandboxes oom_score_adj -998, which needs CAP_SYS_RESOURCE (not held here).
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$STATE/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NR/cni"
EOF
  cat >"$NR/cni/10-mj-realnode.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "mj-realnode",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DATA/cni-ipam",
        "ranges": [[{"subnet": "$SUBNET", "rangeStart": "10.123.0.10", "rangeEnd": "10.123.0.250", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  cat >"$NR/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dev
  cluster:
    server: https://127.0.0.1:$(api_port)
    certificate-authority: $p/ca.crt
users:
- name: node
  user:
    client-certificate: $d/kubelet-client.crt
    client-key: $d/kubelet-client.key
contexts:
- name: dev
  context: {cluster: dev, user: node}
current-context: dev
EOF
  cat >"$NR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $2
tlsCertFile: $d/kubelet.crt
tlsPrivateKeyFile: $d/kubelet.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: $p/ca.crt
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$CTRD_SOCK
imageServiceEndpoint: unix://$CTRD_SOCK
# This machine: no systemd (cgroupfs), cgroup v1 controllers, swap tolerated.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
podLogsDir: $DATA/pod-logs
registerNode: true
registerWithTaints:
- key: $NODE_LABEL
  value: "true"
  effect: NoSchedule
# Images cannot be pulled here: never collect the imported ones.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
evictionPressureTransitionPeriod: 10s
maxPods: 30
serializeImagePulls: false
resolvConf: /etc/resolv.conf
clusterDNS:
- $NODE_IP
clusterDomain: cluster.local
EOF
  # Cluster DNS for the node's Pods: on the bridge address only.
  cat >"$NR/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    health $NODE_IP:$DNS_HEALTH_PORT
    cache 5
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KUBECONFIG_PATH managed-jobs-dev
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
}
EOF
}

DNS_HEALTH_PORT=18053
dns_ready() { curl -sf --max-time 2 "http://$NODE_IP:$DNS_HEALTH_PORT/health" >/dev/null; }
start_dns() {
  start_daemon coredns "$COREDNS_BIN" -conf "$NR/Corefile"
  wait_until "cluster DNS (CoreDNS)" 30 dns_ready || { tail_log coredns; die "CoreDNS did not start"; }
}

# ---------------------------------------------------------------------------------------------
# Host network
# ---------------------------------------------------------------------------------------------

network_up() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  ip addr replace "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"
  iptables -t nat -N "$CHAIN" 2>/dev/null || iptables -t nat -F "$CHAIN"
  iptables -t nat -A "$CHAIN" -d "$SERVICE_IP/32" -p tcp --dport 443 -j DNAT --to-destination "127.0.0.1:$(api_port)"
  iptables -t nat -C PREROUTING -i "$BRIDGE" -j "$CHAIN" 2>/dev/null ||
    iptables -t nat -A PREROUTING -i "$BRIDGE" -j "$CHAIN"
}

network_down() {
  while iptables -t nat -D PREROUTING -i "$BRIDGE" -j "$CHAIN" 2>/dev/null; do :; done
  iptables -t nat -F "$CHAIN" 2>/dev/null || true
  iptables -t nat -X "$CHAIN" 2>/dev/null || true
  # Pod network namespaces containerd made (recorded at up: only those that were not there).
  local ns
  if [[ -f "$NR/netns-before" ]]; then
    for ns in /run/netns/cni-*; do
      [[ -e "$ns" ]] || continue
      grep -qxF "$ns" "$NR/netns-before" && continue
      umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null || true
      rm -f "$ns" 2>/dev/null || log "could not remove $ns"
    done
  fi
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
}

# The kubelet adds chains of its own (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) to
# iptables and ip6tables; there is no setting to stop it. The chains present before it started
# are recorded, and `down` removes every KUBE-* chain added since, with the rules that jump to
# it (chains other tools added meanwhile are left alone).
save_chains() {
  [[ -s "$NR/chains-before" ]] && return 0
  local cmd
  for cmd in iptables ip6tables; do
    command -v "$cmd-save" >/dev/null 2>&1 || continue
    "$cmd-save" 2>/dev/null | awk -v c="$cmd" '/^\*/ { t = substr($0, 2) } /^:/ { print c, t, substr($1, 2) }'
  done >"$NR/chains-before"
}

remove_new_chains() {
  [[ -f "$NR/chains-before" ]] || return 0
  local cmd table chain jumps n
  for cmd in iptables ip6tables; do
    command -v "$cmd-save" >/dev/null 2>&1 || continue
    while read -r table chain; do
      grep -qxF "$cmd $table $chain" "$NR/chains-before" && continue
      # Only the kubelet's chains: others made meanwhile (podman's, docker's) are not ours.
      [[ "$chain" == KUBE-* ]] || continue
      # Rules anywhere in the table that jump to it, deleted by number from the last.
      for jumps in $("$cmd-save" -t "$table" 2>/dev/null | awk -v c="$chain" '/^-A / { for (i = 3; i <= NF; i++) if (($i == "-j" || $i == "-g") && $(i + 1) == c) print $2 }' | sort -u); do
        for n in $("$cmd" -t "$table" -L "$jumps" -n --line-numbers 2>/dev/null | awk -v c="$chain" '$2 == c { print $1 }' | sort -rn); do
          "$cmd" -t "$table" -D "$jumps" "$n" 2>/dev/null || true
        done
      done
      "$cmd" -t "$table" -F "$chain" 2>/dev/null || true
      "$cmd" -t "$table" -X "$chain" 2>/dev/null || log "could not remove $cmd chain $table/$chain"
    done < <("$cmd-save" 2>/dev/null | awk '/^\*/ { t = substr($0, 2) } /^:/ { print t, substr($1, 2) }')
  done
  rm -f "$NR/chains-before"
}

# Fixed host paths the kubelet, containerd and the CNI library use whatever they are told: the
# container log links, the device-plugin socket, containerd's shim sockets, the CNI result cache
# and its config lock, the network namespaces' mount dir. Those that did not exist before `up` are
# removed by `down`; in those that did, only this node's entries are.
FIXED_PATHS=(/var/log/containers /var/lib/kubelet /run/containerd /var/lib/cni /etc/cni /run/netns)

save_fixed_paths() {
  [[ -f "$NR/paths-created" ]] && return 0
  local p
  for p in "${FIXED_PATHS[@]}"; do [[ -e "$p" ]] || echo "$p"; done >"$NR/paths-created"
}

remove_fixed_paths() {
  local l p
  for l in /var/log/containers/*; do
    [[ -L "$l" ]] || continue
    case "$(readlink "$l")" in "$DATA"/*) rm -f "$l" ;; esac
  done
  rm -f /var/lib/cni/results/mj-realnode-* 2>/dev/null || true
  [[ -f "$NR/paths-created" ]] || return 0
  while read -r p; do
    [[ -n "$p" && -e "$p" ]] || continue
    if grep -q " $p[/ ]" /proc/self/mountinfo; then log "$p still has mounts; left in place"; continue; fi
    rm -rf "$p"
  done <"$NR/paths-created"
  rm -f "$NR/paths-created"
}

# ---------------------------------------------------------------------------------------------
# Mounts and cgroups
# ---------------------------------------------------------------------------------------------

# Every mount point under our data and state dirs, deepest first.
our_mounts() {
  awk -v a="$DATA" -v b="$STATE" '{ p = $5; gsub(/\\040/, " ", p); if (index(p, a) == 1 || index(p, b) == 1) print p }' /proc/self/mountinfo |
    awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2-
}

unmount_all() {
  local m i
  for ((i = 0; i < 5; i++)); do
    [[ -n "$(our_mounts)" ]] || return 0
    while read -r m; do [[ -n "$m" ]] && { umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; }; done < <(our_mounts)
  done
  [[ -z "$(our_mounts)" ]] || log "mounts left behind: $(our_mounts | tr '\n' ' ')"
}

# The kubelet's cgroups (cgroupfs driver): /kubepods in every hierarchy.
remove_cgroups() {
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods.slice; do
    [[ -d "$d" ]] || continue
    find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ -d "$d" ]] && log "cgroup $d still has processes"
  done
  return 0
}

# The kernel settings the kubelet sets at start (pkg/kubelet/cm: setupKernelTunables) are
# recorded before it starts and put back by `down`.
KERNEL_TUNABLES=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

save_sysctls() {
  [[ -s "$NR/sysctls-before" ]] && return 0
  local k
  for k in "${KERNEL_TUNABLES[@]}"; do printf '%s=%s\n' "$k" "$(sysctl -n "$k" 2>/dev/null)"; done >"$NR/sysctls-before"
}

restore_sysctls() {
  [[ -f "$NR/sysctls-before" ]] || return 0
  local line
  while read -r line; do [[ "$line" == *=?* ]] && sysctl -qw "$line" 2>/dev/null || true; done <"$NR/sysctls-before"
  rm -f "$NR/sysctls-before"
}

# ---------------------------------------------------------------------------------------------
# up / down
# ---------------------------------------------------------------------------------------------

node_ready() { # says on stderr what it saw when the node is not Ready
  local ready
  ready="$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].message}' 2>&1)"
  [[ "$ready" == "True "* ]] || { printf 'Ready: %s\n' "${ready:-no node}" >&2; return 1; }
}

containerd_ready() { ctr -a "$CTRD_SOCK" version >/dev/null 2>&1; }

free_ports() {
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

# The real node is one per machine (its bridge, paths and iptables chain are machine-wide): the
# control plane instance that started it owns it, recorded in $OWNER. Another instance's `down`
# leaves it alone, and another instance's `up --real-node` is refused while the owner runs it.
OWNER="$DATA/owner"

owner() { [[ -f "$OWNER" ]] && cat "$OWNER"; return 0; }

# The identity of the control plane the node was set up for: its API server port and CA. A node
# set up for another (an instance stopped and started again) must be set up anew.
# Bump REALNODE_LAYOUT when the node's configs change (2: cluster DNS), so that `up` sets up anew
# a node made by an older version of this script instead of repairing it.
REALNODE_LAYOUT=2
control_plane_id() { printf '%s %s %s' "$(api_port)" "$(sha256sum <"$RUN/pki/ca.crt" | cut -c1-16)" "$REALNODE_LAYOUT"; }

node_healthy() { pid_alive containerd && containerd_ready && pid_alive coredns && pid_alive kubelet && node_ready 2>/dev/null; }

cmd_up() {
  [[ $EUID == 0 ]] || die "the real node needs root (mounts, a bridge, iptables, cgroups)"
  local start=$SECONDS current
  current="$(owner)"
  if [[ -n "$current" && "$current" != "$RUN" ]]; then
    if [[ -d "$current/realnode/pids" ]] && RUN="$current" NR="$current/realnode" pid_alive kubelet; then
      die "the real node is in use by the control plane at ${current%/run} (one per machine); stop it there first (MJ_CACHE_DIR=${current%/controlplane/run} hack/controlplane.sh down)"
    fi
    log "taking over the real node from the stopped instance at $current"
    RUN="$current" NR="$current/realnode" cmd_down force >/dev/null 2>&1 || true
  fi
  # Set up for this very control plane: repair what stopped (a killed kubelet or containerd),
  # keeping the node's data (images, volumes, running Pods).
  if [[ -f "$NR/control-plane" && "$(<"$NR/control-plane")" == "$(control_plane_id)" && -d "$DATA/containerd" ]]; then
    if node_healthy; then
      reset_released_volumes
      log "reusing the running real node $NODE_NAME"
      return 0
    fi
    log "repairing the real node $NODE_NAME (keeping its images, volumes and Pods)"
    if repair; then
      reset_released_volumes
      log "real node $NODE_NAME Ready again in $((SECONDS - start)) s"
      return 0
    fi
    log "repair failed; setting the node up anew"
  fi
  # Anything half-started, or set up for another control plane, goes first.
  cmd_down >/dev/null 2>&1 || true
  ensure_packages
  mkdir -p "$NR" "$DATA" "$STATE"
  printf '%s' "$RUN" >"$OWNER"
  { ls -d /run/netns/cni-* 2>/dev/null || true; } >"$NR/netns-before"
  save_fixed_paths
  trap 'rc=$?; if ((rc != 0)); then log "up failed; tearing the node down (logs: $NR/logs)"; tail_log containerd; tail_log kubelet; cmd_down || true; fi' EXIT

  gen_node_pki
  local ports kport hport
  ports="$(free_ports 2)"; read -r kport hport <<<"$ports"
  write_configs "$kport" "$hport"
  network_up

  start_containerd
  local pause busybox
  pause="$(pause_archive)"
  busybox="$(busybox_archive)"
  cmd_load "$pause" "$busybox"
  # The sandbox image must run /pause.
  image_present "$SANDBOX_IMAGE" || die "the sandbox image $SANDBOX_IMAGE was not imported; containerd lists: ${IMAGES_SEEN:-nothing}"

  save_sysctls
  save_chains
  start_dns
  start_kubelet
  if ! wait_until "node $NODE_NAME Ready" 120 node_ready; then
    die "node $NODE_NAME did not become Ready"
  fi
  create_volumes
  control_plane_id >"$NR/control-plane"
  trap - EXIT
  log "real node $NODE_NAME Ready in $((SECONDS - start)) s (kubelet https://$NODE_IP:$kport)"
}

start_containerd() {
  start_daemon containerd "$(command -v containerd)" --config "$NR/containerd.toml"
  wait_until "containerd" 30 containerd_ready || die "containerd did not start"
}

start_kubelet() {
  start_daemon kubelet "$KUBELET_BIN" \
    --config="$NR/kubelet.yaml" --kubeconfig="$NR/kubelet.kubeconfig" \
    --root-dir="$DATA/kubelet" --cert-dir="$NR/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" \
    --node-labels="$NODE_LABEL=true" --v=1
}

# Starts again whatever of the node stopped, with the data it has: containerd (running
# containers keep their shims), the network rules, the kubelet.
repair() {
  network_up || return 1
  if ! { pid_alive containerd && containerd_ready; }; then
    stop_daemon containerd 5
    start_containerd || return 1
  fi
  image_present "$SANDBOX_IMAGE" || cmd_load "$(pause_archive)" "$(busybox_archive)" || return 1
  if ! pid_alive coredns; then
    start_dns || return 1
  fi
  if ! pid_alive kubelet; then
    start_kubelet || return 1
  fi
  wait_until "node $NODE_NAME Ready" 120 node_ready
}

# The dev control plane has no volume provisioner: the node offers VOLUMES hostPath
# PersistentVolumes of 2Gi without a storage class, so that a claim without one (the chart's
# default state volume) binds. Each is a folder under $DATA/volumes, writable by any user.
VOLUMES=3
create_volumes() {
  local i manifest=""
  for ((i = 0; i < VOLUMES; i++)); do
    mkdir -p "$DATA/volumes/pv-$i"
    chmod 0777 "$DATA/volumes/pv-$i"
    manifest+="---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: $NODE_NAME-pv-$i
  labels:
    $NODE_LABEL: \"true\"
spec:
  capacity:
    storage: 2Gi
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: \"\"
  hostPath:
    path: $DATA/volumes/pv-$i
    type: Directory
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [$NODE_NAME]}
"
  done
  printf '%s' "$manifest" | kc apply -f - >/dev/null
}

# A volume whose claim was deleted is Released (policy Retain) and never bound again: wipe its
# folder and offer it again, as a provisioner would give a new one.
reset_released_volumes() {
  local pv path
  for pv in $(kc get pv -l "$NODE_LABEL=true" -o jsonpath='{range .items[?(@.status.phase=="Released")]}{.metadata.name}{" "}{end}' 2>/dev/null); do
    path="$(kc get pv "$pv" -o jsonpath='{.spec.hostPath.path}')"
    [[ "$path" == "$DATA"/volumes/* ]] || continue
    find "$path" -mindepth 1 -delete 2>/dev/null || true
    kc patch pv "$pv" --type json -p '[{"op":"remove","path":"/spec/claimRef"}]' >/dev/null &&
      log "volume $pv was Released: wiped and offered again"
  done
  return 0
}

cmd_down() { # [force: the owner is a stopped instance being taken over]
  # Every step below goes on when one fails (a busy mount, a rule already gone): a teardown that
  # stops halfway could not be run again.
  local -
  set +e
  local current any=0
  current="$(owner)"
  if [[ -n "$current" && "$current" != "$RUN" && "${1:-}" != force ]]; then
    log "the real node belongs to the control plane at $current; left alone"
    return 0
  fi
  [[ -d "$NR" || -d "$DATA" || -d "$STATE" ]] && any=1
  ip link show "$BRIDGE" >/dev/null 2>&1 && any=1
  ((any)) || return 0
  # 1. Workloads: through the API while it answers, so the kubelet stops them and their network.
  if pid_alive kubelet && kc get node "$NODE_NAME" >/dev/null 2>&1; then
    kc delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --grace-period=1 --wait=false >/dev/null 2>&1 || true
    local i
    for ((i = 0; i < 100; i++)); do
      [[ -z "$(ctr_ tasks ls -q 2>/dev/null)" ]] && break
      sleep 0.2
    done
    kc delete node "$NODE_NAME" --wait=false >/dev/null 2>&1 || true
    kc delete pv -l "$NODE_LABEL=true" --wait=false >/dev/null 2>&1 || true
  fi
  # 2. The kubelet and the cluster DNS, then whatever still runs in containerd.
  stop_daemon kubelet 15
  stop_daemon coredns 5
  if containerd_ready; then
    local t
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 0.5
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true; done
    for t in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers rm "$t" >/dev/null 2>&1 || true; done
  fi
  stop_daemon containerd 10
  # Shims of our containerd that outlived it.
  local pid
  for pid in $(pgrep -f "containerd-shim.*-address $CTRD_SOCK" 2>/dev/null || true); do kill -KILL "$pid" 2>/dev/null || true; done
  # 3. Mounts, cgroups, files.
  unmount_all
  remove_cgroups
  network_down
  remove_new_chains
  remove_fixed_paths
  restore_sysctls
  rm -rf "$DATA" "$STATE"
  rm -rf "$NR/pki" "$NR/pids" "$NR/images" "$NR/cni" "$NR"/*.yaml "$NR"/*.toml "$NR"/*.kubeconfig "$NR/Corefile" "$NR/netns-before" "$NR/control-plane"
  [[ -d "$DATA" || -d "$STATE" ]] && log "could not remove all of $DATA and $STATE (see above)"
  log "real node removed"
  return 0
}

cmd_status() {
  local d rc=0
  for d in containerd coredns kubelet; do
    if pid_alive "$d"; then echo "$d running (pid $(<"$NR/pids/$d.pid"))"; else echo "$d not running"; rc=1; fi
  done
  return "$rc"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  load) shift; cmd_load "$@" ;;
  *) die "usage: $0 up|down|status|load ARCHIVE..." ;;
esac
