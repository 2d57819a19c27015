#!/usr/bin/env bash
# Origin: the test harness's shared/k8s/kubelet-up.sh (tested with v1.36.2 builds), adapted
# for gpushare: `restart-kubelet` (containerd and the pods stay) and the ports in the env file.
#
# kubelet-up.sh - add one REAL node to a control plane started by k8s-up.sh:
#   containerd (CRI plugin, runc) + kubelet, both under DIR/nodes/NODE.
#
# Needs: root, a running `k8s-up.sh start DIR`, the kubelet binary in $K8S_BIN_DIR,
# and containerd/ctr/runc/busybox (`install.sh --kubelet` installs them:
# apt-get install containerd runc busybox-static).
# Nothing is downloaded: the only images are built here from /bin/busybox and
# imported into containerd ("localhost/busybox:1", and "localhost/pause:1" as the
# sandbox image). Pods must use hostNetwork: true (there is no pod network) and
# imagePullPolicy: Never (or IfNotPresent).
#
# Usage:
#   kubelet-up.sh start  DIR [NODE]   # NODE defaults to kubelet-1 (unique per DIR)
#   kubelet-up.sh stop   DIR [NODE]   # kills only what this script started for NODE
#   kubelet-up.sh status DIR [NODE]
#   kubelet-up.sh restart-kubelet DIR [NODE]  # SIGTERM the kubelet and start it again with
#                                    # the same arguments; containerd and the pods stay, and
#                                    # device plugins must register again (kubelet.sock is new)
#
# After `start`, DIR/nodes/NODE/env holds KUBELET_NODE, KUBELET_ROOT_DIR,
# KUBELET_DEVICE_PLUGIN_DIR (= ROOT_DIR/device-plugins, kubelet.sock is there),
# KUBELET_POD_RESOURCES_SOCKET, CONTAINERD_ADDRESS, KUBELET_TEST_IMAGE, ...
#
# Environment (all optional):
#   K8S_BIN_DIR            where `kubelet` is ($GPUSHARE_K8S_BIN_DIR, else
#                          ~/.cache/gpushare/k8s, where the project builds them)
#   CONTAINERD_BIN CTR_BIN RUNC_BIN BUSYBOX_BIN       (from PATH / /bin/busybox)
#   K8S_KUBELET_PORT (10250)  K8S_KUBELET_HEALTHZ_PORT (10248)
#                          keep them below 32768: ports in the ephemeral range can be
#                          taken by outgoing connections (e.g. the apiserver's to etcd)
#   K8S_KUBELET_V (2)      kubelet log verbosity
#   K8S_KUBELET_IMAGE (localhost/busybox:1)  K8S_KUBELET_PAUSE_IMAGE (localhost/pause:1)
#   K8S_KUBELET_ISOLATE_DP (true)  run kubelet in its own mount namespace in which
#                          /var/lib/kubelet/device-plugins (hard-coded in kubelet) and
#                          /var/log/containers are bind mounts of dirs under DIR.
#                          false: kubelet uses the real /var/lib/kubelet/device-plugins.
#   K8S_KUBELET_ETC_HOSTS (true)  add "127.0.0.1 NODE" to /etc/hosts (removed on stop)
#                          so that kube-apiserver can reach the kubelet (kubectl logs/exec)
#   K8S_KUBELET_DELETE_NODE (true)  stop force-deletes the node's pods, its CSINode,
#                          Lease and the Node, so that a kubelet started again under
#                          the same name does not run the old pods again
#   K8S_KUBELET_CONFIG_EXTRA  YAML lines appended to the KubeletConfiguration
#                          (only keys that the script does not already set)
#   K8S_KUBELET_EXTRA_ARGS (word-split, appended to the kubelet command line)
#   K8S_KUBELET_START_TIMEOUT (120 seconds per step)
set -euo pipefail

K8S_BIN_DIR="${K8S_BIN_DIR:-${GPUSHARE_K8S_BIN_DIR:-$HOME/.cache/gpushare/k8s}}"
CONTAINERD_BIN="${CONTAINERD_BIN:-$(command -v containerd || true)}"
CTR_BIN="${CTR_BIN:-$(command -v ctr || true)}"
RUNC_BIN="${RUNC_BIN:-$(command -v runc || true)}"
BUSYBOX_BIN="${BUSYBOX_BIN:-/bin/busybox}"
K8S_KUBELET_PORT="${K8S_KUBELET_PORT:-10250}"
K8S_KUBELET_HEALTHZ_PORT="${K8S_KUBELET_HEALTHZ_PORT:-10248}"
K8S_KUBELET_V="${K8S_KUBELET_V:-2}"
K8S_KUBELET_IMAGE="${K8S_KUBELET_IMAGE:-localhost/busybox:1}"
K8S_KUBELET_PAUSE_IMAGE="${K8S_KUBELET_PAUSE_IMAGE:-localhost/pause:1}"
K8S_KUBELET_ISOLATE_DP="${K8S_KUBELET_ISOLATE_DP:-true}"
K8S_KUBELET_ETC_HOSTS="${K8S_KUBELET_ETC_HOSTS:-true}"
K8S_KUBELET_DELETE_NODE="${K8S_KUBELET_DELETE_NODE:-true}"
K8S_KUBELET_CONFIG_EXTRA="${K8S_KUBELET_CONFIG_EXTRA:-}"
K8S_KUBELET_START_TIMEOUT="${K8S_KUBELET_START_TIMEOUT:-120}"

# kubelet's compiled-in paths that --root-dir does not move
HOST_DP_DIR=/var/lib/kubelet/device-plugins
HOST_CONTAINER_LOGS_DIR=/var/log/containers
# original values of the sysctls kubelet rewrites (shared by all harness kubelets)
SYSCTL_SAVE="${TMPDIR:-/tmp}/k8s-harness-kubelet-sysctl.orig"
SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
  kernel/keys/root_maxkeys kernel/keys/root_maxbytes)

die() { echo "kubelet-up: $*" >&2; exit 1; }
log() { echo "kubelet-up: $*" >&2; }
usage() { sed -n '6,27p' "$0" >&2; exit 2; }

# --- process bookkeeping (same rules as k8s-up.sh) --------------------------------

pid_alive() {
  local pidfile="$1" name="$2" pid exe
  [[ -f "$pidfile" ]] || return 1
  pid="$(cat "$pidfile")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -d "/proc/$pid" ]] || return 1
  exe="$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | head -n1)"
  [[ "$(basename -- "$exe")" == "$name" ]]
}

stop_one() {
  local nd="$1" name="$2" pidfile pid i
  pidfile="$nd/pids/$name.pid"
  [[ -f "$pidfile" ]] || return 0
  pid="$(cat "$pidfile")"
  if pid_alive "$pidfile" "$name"; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
      pid_alive "$pidfile" "$name" || break
      sleep 0.1
    done
    if pid_alive "$pidfile" "$name"; then
      log "$name (pid $pid) did not exit after SIGTERM, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
  fi
  rm -f "$pidfile"
}

# launch ND NAME ARGS... (ARGS[0] may be a wrapper that execs NAME)
launch() {
  local nd="$1" name="$2"; shift 2
  local pid i
  nohup "$@" > "$nd/logs/$name.log" 2>&1 < /dev/null &
  pid=$!
  echo "$pid" > "$nd/pids/$name.pid"
  for ((i = 0; i < 100; i++)); do
    pid_alive "$nd/pids/$name.pid" "$name" && break
    [[ -d "/proc/$pid" ]] || break
    sleep 0.1
  done
  log "started $name (pid $pid) log: $nd/logs/$name.log"
}

wait_for() {
  local nd="$1" name="$2" what="$3"; shift 3
  local deadline=$((SECONDS + K8S_KUBELET_START_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! pid_alive "$nd/pids/$name.pid" "$name"; then
      tail -n 30 "$nd/logs/$name.log" >&2 || true
      die "$name exited during start-up (see $nd/logs/$name.log)"
    fi
    if "$@" > /dev/null 2>&1; then
      log "$name: $what"
      return 0
    fi
    sleep 0.5
  done
  tail -n 30 "$nd/logs/$name.log" >&2 || true
  die "$name: not $what after ${K8S_KUBELET_START_TIMEOUT}s (see $nd/logs/$name.log)"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# --- control plane access (DIR/env from k8s-up.sh) -------------------------------------

load_env() {
  local dir="$1"
  [[ -f "$dir/env" ]] || die "no $dir/env: run k8s-up.sh start $dir first"
  # shellcheck disable=SC1091
  . "$dir/env"
  [[ -n "${K8S_API_URL:-}" && -n "${K8S_TOKEN:-}" && -n "${K8S_CA_FILE:-}" && -n "${KUBECONFIG:-}" ]] \
    || die "$dir/env lacks KUBECONFIG/K8S_API_URL/K8S_TOKEN/K8S_CA_FILE"
}

api() { # api METHOD PATH -> body on stdout
  curl -fsS --max-time 10 --cacert "$K8S_CA_FILE" -H "Authorization: Bearer ${K8S_TOKEN}" \
    -X "$1" "${K8S_API_URL}$2"
}

node_ready() {
  api GET "/api/v1/nodes/$1" | python3 -c '
import json, sys
n = json.load(sys.stdin)
ok = any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
sys.exit(0 if ok else 1)'
}

# force-delete the node's pods, then the Node: without this a kubelet started again under
# the same name would run the old pods again (with or without a controller-manager).
delete_node_and_pods() {
  local node="$1" pod n=0
  for pod in $(api GET "/api/v1/pods?fieldSelector=spec.nodeName%3D${node}" | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    print(p["metadata"]["namespace"] + "/" + p["metadata"]["name"])'); do
    api DELETE "/api/v1/namespaces/${pod%%/*}/pods/${pod#*/}?gracePeriodSeconds=0" > /dev/null 2>&1 && n=$((n + 1))
  done
  # objects that name the Node (the garbage collector, if running, would get them later)
  api DELETE "/apis/storage.k8s.io/v1/csinodes/$node" > /dev/null 2>&1 || true
  api DELETE "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/$node" > /dev/null 2>&1 || true
  api DELETE "/api/v1/nodes/$node" > /dev/null 2>&1 || return 0
  log "deleted Node $node and its $n pod(s)"
}

# --- cleanup functions (all scoped to ND / this node's cgroup root) ----------------------

# unmount everything mounted at or below $1, deepest first (repeat: stacked mounts)
umount_below() {
  local base="$1" m i
  for ((i = 0; i < 10; i++)); do
    mapfile -t mps < <(awk -v b="$base" '{ p = $5; gsub(/\\040/, " ", p);
      if (p == b || index(p, b "/") == 1) print length(p) "\t" p }' /proc/self/mountinfo \
      | sort -rn | cut -f2-)
    ((${#mps[@]})) || return 0
    for m in "${mps[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  done
  log "warning: mounts left below $base"
}

# one cgroup root per node directory: the same NODE name in two DIRs must not share it
cgroup_name() { echo "k8s-harness-$1-$(printf '%s' "$2" | sha256sum | cut -c1-8)"; }

cgroup_dirs() { # every cgroup hierarchy's copy of this node's cgroup root
  local cg="$1" h
  for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [[ -d "$h/$cg" ]] && echo "$h/$cg"
  done
  return 0
}

# SIGKILL every process left in this node's cgroup root (containers whose shim is gone)
kill_cgroup_procs() {
  local cg="$1" d pids p
  for d in $(cgroup_dirs "$cg"); do
    pids="$(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)"
    for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  done
}

remove_cgroups() {
  local cg="$1" d i
  for ((i = 0; i < 20; i++)); do
    local left=0
    for d in $(cgroup_dirs "$cg"); do
      find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
      [[ -d "$d" ]] && left=1
    done
    ((left)) || return 0
    sleep 0.2
  done
  log "warning: cgroups left: $(cgroup_dirs "$cg" | tr '\n' ' ')"
}

create_cgroups() {
  local cg="$1" h
  for h in /sys/fs/cgroup/*; do
    [[ -f "$h/cgroup.procs" ]] || continue
    [[ "$(stat -f -c %T "$h")" == "cgroupfs" ]] || continue # v1 hierarchies only
    mkdir -p "$h/$cg"
    if [[ -f "$h/cpuset.cpus" ]]; then # a new v1 cpuset is empty until filled from its parent
      [[ -n "$(cat "$h/$cg/cpuset.cpus")" ]] || cat "$h/cpuset.cpus" > "$h/$cg/cpuset.cpus"
      [[ -n "$(cat "$h/$cg/cpuset.mems")" ]] || cat "$h/cpuset.mems" > "$h/$cg/cpuset.mems"
    fi
  done
  if [[ "$(stat -f -c %T /sys/fs/cgroup)" == "cgroup2fs" ]]; then mkdir -p "/sys/fs/cgroup/$cg"; fi
}

hosts_marker() { echo "# k8s-harness kubelet-up $1"; }

hosts_remove() { # drop our own line(s) from /etc/hosts, keeping the file's inode
  local marker="$1" tmp
  tmp="$(mktemp)"
  # lines that END with the marker (".../node-1" must not match ".../node-10")
  if awk -v m="$marker" 'substr($0, length($0) - length(m) + 1) == m { found = 1; next }
      { print } END { exit !found }' /etc/hosts > "$tmp" 2>/dev/null; then
    cat "$tmp" > /etc/hosts
    log "removed $marker from /etc/hosts"
  fi
  rm -f "$tmp"
}

other_kubelets_running() { # any live kubelet process other than ours? (read-only check)
  local mine="$1" p
  for p in $(pgrep -x kubelet 2>/dev/null || true); do
    [[ "$p" == "$mine" ]] && continue
    # a stopped kubelet can linger as a zombie until its parent reaps it
    [[ "$(awk '/^State:/ { print $2 }' "/proc/$p/status" 2>/dev/null)" == Z ]] && continue
    [[ -d "/proc/$p" ]] && return 0
  done
  return 1
}

# --- image ------------------------------------------------------------------------------

# docker-archive with two tags sharing one layer: /bin/busybox + applet symlinks
build_image_tar() {
  python3 - "$BUSYBOX_BIN" "$1" "$K8S_KUBELET_IMAGE" "$K8S_KUBELET_PAUSE_IMAGE" << 'PYEOF'
import hashlib, io, json, subprocess, sys, tarfile
busybox, out, img, pause = sys.argv[1:5]
applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
def ti(name, **kw):
    t = tarfile.TarInfo(name); t.mtime = 0; t.uid = t.gid = 0; t.uname = t.gname = "root"
    for k, v in kw.items(): setattr(t, k, v)
    return t
lb = io.BytesIO()
with tarfile.open(fileobj=lb, mode="w", format=tarfile.GNU_FORMAT) as lt:
    for d in ["bin", "etc", "tmp", "root", "proc", "sys", "dev", "var", "run"]:
        lt.addfile(ti(d, type=tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755))
    data = open(busybox, "rb").read()
    lt.addfile(ti("bin/busybox", size=len(data), mode=0o755), io.BytesIO(data))
    for a in sorted(set(applets) - {"busybox"}):
        lt.addfile(ti("bin/" + a, type=tarfile.SYMTYPE, linkname="busybox", mode=0o777))
    for n, c in [("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
                 ("etc/group", "root:x:0:\nnogroup:x:65534:\n")]:
        b = c.encode(); lt.addfile(ti(n, size=len(b), mode=0o644), io.BytesIO(b))
layer = lb.getvalue()
diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
def config(cfg):
    c = {"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
         "config": dict({"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                         "WorkingDir": "/"}, **cfg),
         "rootfs": {"type": "layers", "diff_ids": [diff_id]},
         "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "k8s-harness kubelet-up.sh from " + busybox}]}
    b = json.dumps(c, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(b).hexdigest() + ".json", b
c1, b1 = config({"Cmd": ["sh"]})
c2, b2 = config({"Entrypoint": ["/bin/sleep", "infinity"]})   # the sandbox ("pause") image
ldir = diff_id[7:]
manifest = [{"Config": c1, "RepoTags": [img], "Layers": [ldir + "/layer.tar"]},
            {"Config": c2, "RepoTags": [pause], "Layers": [ldir + "/layer.tar"]}]
with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as t:
    t.addfile(ti(ldir, type=tarfile.DIRTYPE, mode=0o755))
    for n, b in [(c1, b1), (c2, b2), (ldir + "/layer.tar", layer), ("manifest.json", json.dumps(manifest).encode())]:
        t.addfile(ti(n, size=len(b), mode=0o644), io.BytesIO(b))
PYEOF
}

# --- config files -------------------------------------------------------------------------

write_containerd_config() {
  local nd="$1"
  cat > "$nd/containerd/config.toml" << EOF
version = 2
root = "$nd/containerd/root"
state = "$nd/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$nd/containerd.sock"
[ttrpc]
  address = "$nd/containerd.sock.ttrpc"
[debug]
  level = "info"
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "${K8S_KUBELET_PAUSE_IMAGE}"
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    # where root lacks CAP_SYS_RESOURCE (some VMs and containers), runc cannot set the
    # sandbox's oom_score_adj -998 ("can't get final child's PID from pipe: EOF");
    # clamp to containerd's own score
    restrict_oom_score_adj = true
    disable_hugetlb_controller = true
    tolerate_missing_hugetlb_controller = true
    # network namespaces of non-hostNetwork pods: under the state dir, not /var/run/netns
    netns_mounts_under_state_dir = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$nd/cni/bin"
      conf_dir = "$nd/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "${RUNC_BIN}"
          Root = "$nd/containerd/runc"
          SystemdCgroup = false
  [plugins."io.containerd.internal.v1.opt"]
    path = "$nd/containerd/opt"
EOF
  # CRI reports NetworkReady=false (and kubelet keeps the node NotReady) without a CNI
  # config. hostNetwork pods never call the plugin; other pods fail at sandbox creation
  # (bin_dir is empty on purpose: containerd 1.6 also insists on an IP on eth0, which
  # would take a bridge/veth on the host).
  cat > "$nd/cni/net.d/10-harness-loopback.conflist" << 'EOF'
{"cniVersion": "0.4.0", "name": "harness-hostnetwork-only", "plugins": [{"type": "loopback"}]}
EOF
}

write_kubelet_config() {
  local nd="$1" node="$2" cg="$3"
  cat > "$nd/kubelet-config.yaml" << EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /${cg}
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
containerRuntimeEndpoint: unix://$nd/containerd.sock
imageServiceEndpoint: unix://$nd/containerd.sock
address: 127.0.0.1
port: ${K8S_KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${K8S_KUBELET_HEALTHZ_PORT}
podLogsDir: $nd/pod-logs
volumePluginDir: $nd/volume-plugins
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
evictionHard: {}
evictionSoft: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 876000h
registerNode: true
rotateCertificates: false
serverTLSBootstrap: false
serializeImagePulls: false
maxPods: 110
nodeStatusUpdateFrequency: 4s
nodeStatusReportFrequency: 10s
syncFrequency: 10s
resolvConf: /etc/resolv.conf
protectKernelDefaults: false
EOF
  if [[ -n "$K8S_KUBELET_CONFIG_EXTRA" ]]; then printf '%s\n' "$K8S_KUBELET_CONFIG_EXTRA" >> "$nd/kubelet-config.yaml"; fi
}

# --- commands --------------------------------------------------------------------------

cmd_start() {
  local dir="$1" node="$2"
  [[ -d "$dir" ]] || die "no such directory: $dir"
  dir="$(cd "$dir" && pwd -P)"
  local nd="$dir/nodes/$node" cg
  cg="$(cgroup_name "$node" "$nd")"
  [[ "$(id -u)" == 0 ]] || die "must run as root"
  [[ "$node" =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || die "bad node name: $node"
  load_env "$dir"
  local kubelet="$K8S_BIN_DIR/kubelet"
  [[ -x "$kubelet" ]] || die "no kubelet at $kubelet (set K8S_BIN_DIR)"
  local b
  for b in CONTAINERD_BIN CTR_BIN RUNC_BIN BUSYBOX_BIN; do
    [[ -n "${!b}" && -x "${!b}" ]] || die "$b not found (apt-get install containerd runc busybox-static)"
  done
  command -v python3 > /dev/null || die "python3 is needed"
  command -v unshare > /dev/null || die "unshare (util-linux) is needed"
  api GET /readyz > /dev/null || die "kube-apiserver at $K8S_API_URL is not ready (k8s-up.sh start $dir?)"
  pid_alive "$nd/pids/kubelet.pid" kubelet && die "kubelet for $node already running; run: $0 stop $dir $node"
  pid_alive "$nd/pids/containerd.pid" containerd && die "containerd for $node already running; run: $0 stop $dir $node"
  local p
  for p in "$K8S_KUBELET_PORT" "$K8S_KUBELET_HEALTHZ_PORT"; do
    port_free "$p" || die "127.0.0.1:$p is in use (set K8S_KUBELET_PORT / K8S_KUBELET_HEALTHZ_PORT)"
  done
  if [[ "$K8S_KUBELET_ISOLATE_DP" != "true" ]] && [[ -S "$HOST_DP_DIR/kubelet.sock" ]] \
    && other_kubelets_running ""; then
    die "another kubelet owns $HOST_DP_DIR; use K8S_KUBELET_ISOLATE_DP=true"
  fi
  local dpdir="$nd/kubelet/device-plugins"
  [[ "$K8S_KUBELET_ISOLATE_DP" == "true" ]] || dpdir="$HOST_DP_DIR"
  local sock="$dpdir/kubelet.sock"
  ((${#sock} < 100)) || die "socket path too long (${#sock} chars, unix limit 107): $sock - use a shorter DIR"

  # leftovers of an earlier run of this node
  if [[ -d "$nd" ]]; then cleanup_node "$dir" "$node"; fi
  rm -rf "$nd"
  mkdir -p "$nd"/{logs,pids,containerd/root,containerd/state,containerd/runc,cni/net.d,cni/bin} \
    "$nd"/{kubelet/device-plugins,kubelet/pki,pod-logs,volume-plugins,container-logs,images}
  _START_DIR="$dir" _START_NODE="$node"
  trap 'rc=$?; if [[ $rc -ne 0 ]]; then log "start failed, cleaning up"; cmd_stop "$_START_DIR" "$_START_NODE" || true; fi' EXIT

  # 1. containerd
  write_containerd_config "$nd"
  launch "$nd" containerd "$CONTAINERD_BIN" --config "$nd/containerd/config.toml"
  wait_for "$nd" containerd "serving" "$CTR_BIN" -a "$nd/containerd.sock" version

  # 2. images (built from busybox-static, never pulled)
  build_image_tar "$nd/images/busybox.tar"
  "$CTR_BIN" -a "$nd/containerd.sock" -n k8s.io images import "$nd/images/busybox.tar" > "$nd/logs/image-import.log" 2>&1 \
    || { cat "$nd/logs/image-import.log" >&2; die "image import failed"; }
  local refs
  refs="$("$CTR_BIN" -a "$nd/containerd.sock" -n k8s.io images ls -q)"
  grep -qxF "$K8S_KUBELET_IMAGE" <<< "$refs" && grep -qxF "$K8S_KUBELET_PAUSE_IMAGE" <<< "$refs" \
    || die "images missing after import: $refs"
  log "imported $K8S_KUBELET_IMAGE and $K8S_KUBELET_PAUSE_IMAGE"

  # 3. host preparation: cgroup root, sysctls, /etc/hosts, shared root-dir mount
  create_cgroups "$cg"
  # keep an existing file: it holds the values from before the first harness kubelet
  if [[ ! -f "$SYSCTL_SAVE" ]]; then
    local k
    for k in "${SYSCTLS[@]}"; do echo "$k $(cat "/proc/sys/$k")"; done > "$SYSCTL_SAVE"
  fi
  if [[ "$K8S_KUBELET_ETC_HOSTS" == "true" ]]; then
    local marker
    marker="$(hosts_marker "$dir/nodes/$node")"
    hosts_remove "$marker"
    # skip only if the name already resolves to loopback by other means than a
    # harness line (another DIR's line for the same name goes away with that node)
    if ! getent ahostsv4 "$node" 2>/dev/null | awk '{print $1}' | grep -q '^127\.' \
      || grep -qF " $node # k8s-harness kubelet-up " /etc/hosts; then
      echo "127.0.0.1 $node $marker" >> /etc/hosts
      log "added '127.0.0.1 $node' to /etc/hosts"
    fi
  fi
  # kubelet bind-mounts its root dir onto itself (rshared) for volume propagation; doing
  # it here, before unshare, makes the kubelet's volume mounts visible to containerd.
  mount --bind "$nd/kubelet" "$nd/kubelet"
  mount --make-shared "$nd/kubelet"

  # 4. kubelet (a Node object left from an earlier run would report a stale Ready)
  if api GET "/api/v1/nodes/$node" > /dev/null 2>&1; then
    api DELETE "/api/v1/nodes/$node" > /dev/null && log "deleted stale Node $node"
  fi
  write_kubelet_config "$nd" "$node" "$cg"
  local -a kargs=(
    --config "$nd/kubelet-config.yaml"
    --kubeconfig "$KUBECONFIG"
    --root-dir "$nd/kubelet"
    --cert-dir "$nd/kubelet/pki"
    --hostname-override "$node"
    --v "$K8S_KUBELET_V"
  )
  # shellcheck disable=SC2206
  if [[ -n "${K8S_KUBELET_EXTRA_ARGS:-}" ]]; then kargs+=(${K8S_KUBELET_EXTRA_ARGS}); fi
  # kept for restart-kubelet: the same command line, whatever the environment is then
  local -a kcmd=("$kubelet" "${kargs[@]}")
  if [[ "$K8S_KUBELET_ISOLATE_DP" == "true" ]]; then
    mkdir -p "$HOST_DP_DIR" "$HOST_CONTAINER_LOGS_DIR" # empty mount points on the host
    # own mount namespace (propagation unchanged: $nd/kubelet stays a peer of the host's)
    kcmd=(unshare -m --propagation unchanged -- /bin/sh -c '
      set -e
      for pair in "$0:'"$HOST_DP_DIR"'" "$1:'"$HOST_CONTAINER_LOGS_DIR"'"; do
        src="${pair%%:*}" dst="${pair#*:}"
        mount --make-private "$(findmnt -n -o TARGET -T "$dst")"
        mount --bind "$src" "$dst"
      done
      shift 1
      exec "$@"' "$nd/kubelet/device-plugins" "$nd/container-logs" "${kcmd[@]}")
  fi
  printf '%s\0' "${kcmd[@]}" > "$nd/kubelet.cmd"
  printf '%s\n' "$K8S_KUBELET_HEALTHZ_PORT" "$sock" > "$nd/kubelet.check"
  launch "$nd" kubelet "${kcmd[@]}"
  wait_for "$nd" kubelet "healthz ok" curl -fsS "http://127.0.0.1:${K8S_KUBELET_HEALTHZ_PORT}/healthz"
  wait_for "$nd" kubelet "node $node Ready" node_ready "$node"
  wait_for "$nd" kubelet "device plugin registry socket up" test -S "$sock"

  cat > "$nd/env" << EOF
export KUBELET_NODE='${node}'
export KUBELET_ROOT_DIR='$nd/kubelet'
export KUBELET_DEVICE_PLUGIN_DIR='${dpdir}'
export KUBELET_POD_RESOURCES_SOCKET='$nd/kubelet/pod-resources/kubelet.sock'
export KUBELET_POD_LOGS_DIR='$nd/pod-logs'
export KUBELET_CGROUP_ROOT='/${cg}'
export CONTAINERD_ADDRESS='$nd/containerd.sock'
export CONTAINER_RUNTIME_ENDPOINT='unix://$nd/containerd.sock'
export KUBELET_TEST_IMAGE='${K8S_KUBELET_IMAGE}'
export KUBELET_PAUSE_IMAGE='${K8S_KUBELET_PAUSE_IMAGE}'
export KUBELET_PORT='${K8S_KUBELET_PORT}'
export KUBELET_HEALTHZ_PORT='${K8S_KUBELET_HEALTHZ_PORT}'
EOF
  trap - EXIT
  log "node $node up (env: $nd/env)"
  echo "$nd/env"
}

# everything except killing kubelet/containerd: containers, mounts, cgroups, hosts, sysctls
cleanup_node() {
  local dir="$1" node="$2"
  local nd="$dir/nodes/$node" cg
  cg="$(cgroup_name "$node" "$nd")"
  kill_cgroup_procs "$cg"
  # shims started by this node's containerd (their -address names our socket)
  local p
  for p in $(pgrep -f -- "containerd-shim-runc-v2 .*-address $nd/containerd.sock" 2>/dev/null || true); do
    kill -KILL "$p" 2>/dev/null || true
  done
  umount_below "$nd"
  remove_cgroups "$cg"
  # K8S_KUBELET_ISOLATE_DP=false: kubelet's symlinks in the real /var/log/containers
  local l
  for l in "$HOST_CONTAINER_LOGS_DIR"/*.log; do
    if [[ -L "$l" && "$(readlink "$l")" == "$nd/"* ]]; then rm -f "$l"; fi
  done
  hosts_remove "$(hosts_marker "$dir/nodes/$node")"
}

cmd_stop() {
  local dir="$1" node="$2"
  [[ -d "$dir" ]] || die "no such directory: $dir"
  dir="$(cd "$dir" && pwd -P)"
  local nd="$dir/nodes/$node"
  [[ -d "$nd" ]] || { log "nothing to stop for $node in $dir"; return 0; }
  local kpid=""
  [[ -f "$nd/pids/kubelet.pid" ]] && kpid="$(cat "$nd/pids/kubelet.pid")"
  stop_one "$nd" kubelet
  # containers: kill every task in containerd's k8s.io namespace, then delete them
  if pid_alive "$nd/pids/containerd.pid" containerd; then
    local ctr=("$CTR_BIN" -a "$nd/containerd.sock" -n k8s.io) t
    for t in $("${ctr[@]}" tasks ls -q 2>/dev/null || true); do
      "${ctr[@]}" tasks kill -a -s SIGKILL "$t" > /dev/null 2>&1 || true
    done
    for t in $("${ctr[@]}" tasks ls -q 2>/dev/null || true); do
      timeout 10 "${ctr[@]}" tasks delete -f "$t" > /dev/null 2>&1 || true
    done
  fi
  stop_one "$nd" containerd
  cleanup_node "$dir" "$node"
  if [[ -n "$kpid" ]] && grep -q "^export KUBELET_DEVICE_PLUGIN_DIR='$HOST_DP_DIR'" "$nd/env" 2>/dev/null; then
    # K8S_KUBELET_ISOLATE_DP=false: our kubelet's socket + checkpoint in the shared dir
    rm -f "$HOST_DP_DIR/kubelet.sock" "$HOST_DP_DIR/kubelet_internal_checkpoint"
  fi
  if [[ -f "$SYSCTL_SAVE" ]] && ! other_kubelets_running "$kpid"; then
    local k v
    while read -r k v; do echo "$v" > "/proc/sys/$k" 2>/dev/null || true; done < "$SYSCTL_SAVE"
    rm -f "$SYSCTL_SAVE"
    log "restored kernel sysctls changed by kubelet"
  fi
  if [[ "$K8S_KUBELET_DELETE_NODE" == "true" && -f "$dir/env" ]]; then
    (load_env "$dir" && delete_node_and_pods "$node") || true
  fi
}

cmd_restart_kubelet() {
  local dir="$1" node="$2"
  [[ -d "$dir" ]] || die "no such directory: $dir"
  dir="$(cd "$dir" && pwd -P)"
  local nd="$dir/nodes/$node"
  [[ -f "$nd/kubelet.cmd" && -f "$nd/kubelet.check" ]] || die "node $node was not started from $dir"
  pid_alive "$nd/pids/containerd.pid" containerd || die "containerd for $node is not running"
  load_env "$dir"
  local -a kcmd check
  mapfile -d '' -t kcmd < "$nd/kubelet.cmd"
  mapfile -t check < "$nd/kubelet.check"
  local healthz_port="${check[0]}" sock="${check[1]}"
  stop_one "$nd" kubelet
  # the new kubelet creates it again: its appearance says the registry is up
  rm -f "$sock"
  local i
  for ((i = 0; i < 100; i++)); do port_free "$healthz_port" && break; sleep 0.1; done
  # keep the stopped kubelet's log as kubelet.log.1, .2, ... (launch starts a new one)
  for ((i = 1; ; i++)); do [[ -e "$nd/logs/kubelet.log.$i" ]] || break; done
  mv "$nd/logs/kubelet.log" "$nd/logs/kubelet.log.$i" 2>/dev/null || true
  launch "$nd" kubelet "${kcmd[@]}"
  wait_for "$nd" kubelet "healthz ok" curl -fsS "http://127.0.0.1:${healthz_port}/healthz"
  wait_for "$nd" kubelet "device plugin registry socket up" test -S "$sock"
  wait_for "$nd" kubelet "node $node Ready" node_ready "$node"
}

cmd_status() {
  local dir="$1" node="$2" rc=0 c
  local nd="$dir/nodes/$node"
  for c in containerd kubelet; do
    if pid_alive "$nd/pids/$c.pid" "$c"; then
      echo "$c ($node) running (pid $(cat "$nd/pids/$c.pid"))"
    else
      echo "$c ($node) not running"
      rc=1
    fi
  done
  if ((rc == 0)) && [[ -f "$dir/env" ]]; then
    if (load_env "$dir" && node_ready "$node") 2>/dev/null; then echo "node $node Ready"; else echo "node $node not Ready"; rc=1; fi
  fi
  return $rc
}

[[ $# -ge 2 ]] || usage
NODE="${3:-kubelet-1}"
case "$1" in
  start) cmd_start "$2" "$NODE" ;;
  stop) cmd_stop "$2" "$NODE" ;;
  status) cmd_status "$2" "$NODE" ;;
  restart-kubelet) cmd_restart_kubelet "$2" "$NODE" ;;
  *) usage ;;
esac
