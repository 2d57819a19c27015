#!/usr/bin/env bash
# Origin: the test harness's shared/k8s/k8s-up.sh (tested with v1.36.2 builds), adapted
# for gpushare: extender stanzas as JSON (K8S_SCHEDULER_EXTENDERS), extender TLS,
# `reconfigure-scheduler`, and the ports in DIR/env.
#
# k8s-up.sh - start/stop a throwaway Kubernetes control plane on loopback:
#   etcd + kube-apiserver + kube-scheduler (with an HTTP scheduler extender
#   configured from environment variables) + kube-controller-manager (optional).
#
# There is no kubelet here: add real nodes with kubelet-up.sh, or create Node
# objects by hand. This script never builds or downloads anything; it runs:
#   kube-apiserver, kube-scheduler, kube-controller-manager from $K8S_BIN_DIR
#     (default: $GPUSHARE_K8S_BIN_DIR, else ~/.cache/gpushare/k8s: where the project builds them)
#   etcd: $ETCD_BIN (default: etcd on PATH, else $K8S_BIN_DIR/etcd)
#
# Usage:
#   k8s-up.sh start  DIR [KUBECONFIG_PATH]   # state, certs, logs, pids go under DIR
#   k8s-up.sh stop   DIR                     # kills only the PIDs recorded in DIR/pids
#   k8s-up.sh status DIR
#   k8s-up.sh reconfigure-scheduler DIR      # rewrite the scheduler's configuration from
#                                            # the environment and restart kube-scheduler
#   k8s-up.sh stop-scheduler DIR             # stop kube-scheduler only (pods stay Pending)
#
# After `start`, DIR/env is a shell file with KUBECONFIG, K8S_API_URL,
# K8S_TOKEN, K8S_CA_FILE (source it, or read it from a test).
#
# Environment (all optional):
#   K8S_BIN_DIR, ETCD_BIN
#   K8S_ETCD_PORT (42379)  K8S_ETCD_PEER_PORT (42380)
#   K8S_API_PORT (46443)   K8S_SCHED_PORT (40259)   K8S_CM_PORT (10257)
#   K8S_ADMIN_TOKEN        (random if unset)
#   K8S_AUTHZ_MODE         (RBAC; e.g. AlwaysAllow)
#   K8S_DISABLE_ADMISSION  (ServiceAccount,TaintNodesByCondition; see notes below)
#   K8S_SERVICE_CIDR       (10.96.0.0/16 - virtual ClusterIP range, nothing listens on it)
#   K8S_CONTROLLER_MANAGER (true; false = no kube-controller-manager)
#   K8S_CM_CONTROLLERS     (*,-node-lifecycle-controller,-node-ipam-controller,
#                           -node-route-controller,-cloud-node-lifecycle-controller,
#                           -service-lb-controller; see notes below)
#   K8S_APISERVER_V (1)  K8S_SCHEDULER_V (2)  K8S_CM_V (1)
#   K8S_SCHEDULER_QPS, K8S_SCHEDULER_BURST (empty: kube-scheduler's client defaults,
#                           50 and 100; clientConnection.qps and .burst)
#   K8S_APISERVER_EXTRA_ARGS, K8S_SCHEDULER_EXTRA_ARGS, K8S_CM_EXTRA_ARGS (word-split, appended)
#   K8S_START_TIMEOUT      (120 seconds per component)
#   Extender stanza of the KubeSchedulerConfiguration:
#   EXTENDER_ENABLED            (true; false = no extender at all)
#   EXTENDER_URL_PREFIX         (http://127.0.0.1:39999/gpushare-scheduler)
#   EXTENDER_FILTER_VERB        (filter;     empty = omitted)
#   EXTENDER_PRIORITIZE_VERB    (prioritize; empty = omitted)
#   EXTENDER_BIND_VERB          (bind;       empty = omitted)
#   EXTENDER_PREEMPT_VERB       (empty = omitted)
#   EXTENDER_WEIGHT             (1)
#   EXTENDER_NODE_CACHE_CAPABLE (false)
#   EXTENDER_MANAGED_RESOURCES  (aliyun.com/gpu-mem; comma-separated; empty = none)
#   EXTENDER_IGNORED_BY_SCHEDULER (false; applies to every managed resource)
#   EXTENDER_IGNORABLE          (false)
#   EXTENDER_HTTP_TIMEOUT       (empty = omitted: kube-scheduler default 5s; e.g. 30s)
#   EXTENDER_TLS_CA_FILE        (empty; with an https:// EXTENDER_URL_PREFIX: enableHTTPS and
#                                tlsConfig.caFile; EXTENDER_TLS_CERT_FILE/_KEY_FILE: client cert)
#   K8S_SCHEDULER_EXTENDERS     (a YAML/JSON flow list of extender stanzas, written verbatim as
#                                `extenders:`; when set, every EXTENDER_* variable is ignored)
#
# Notes:
# * kube-controller-manager runs every controller as the admin user (no
#   per-controller ServiceAccount credentials, no leader election). It gets the
#   service-account signing key (legacy token Secrets), the CA as root CA (the
#   kube-root-ca.crt ConfigMaps) and as CSR signer. Left out by default: the
#   cloud and node-IPAM controllers (no cloud, no pod network) and the
#   node-lifecycle controller: Nodes made by hand never heartbeat, and it would
#   taint them node.kubernetes.io/unreachable (NoSchedule and NoExecute) after
#   about 50 s.
# * Tested with builds of OpenShift's fork of v1.36.2, whose controller-manager
#   also writes an openshift-service-ca.crt ConfigMap into every namespace (its
#   ServiceAccount admission projects it into token volumes). Upstream builds
#   have neither; nothing here depends on it.
# * ServiceAccount admission is disabled by default, so pods get no
#   ServiceAccount token volume (nothing to mount or refresh on a test node);
#   TaintNodesByCondition admission is disabled because, without the
#   node-lifecycle controller, nothing would ever remove the
#   node.kubernetes.io/not-ready:NoSchedule taint it puts on new Nodes.
#   K8S_DISABLE_ADMISSION=TaintNodesByCondition turns ServiceAccount admission
#   on (the controller-manager creates the "default" ServiceAccounts it needs);
#   K8S_DISABLE_ADMISSION="" (stock plugins) also needs K8S_CM_CONTROLLERS='*',
#   so that the node-lifecycle controller lifts that taint from Ready nodes.
# * Only 127.0.0.1 is listened on.
set -euo pipefail

K8S_BIN_DIR="${K8S_BIN_DIR:-${GPUSHARE_K8S_BIN_DIR:-$HOME/.cache/gpushare/k8s}}"
ETCD_BIN="${ETCD_BIN:-$(command -v etcd || echo "$K8S_BIN_DIR/etcd")}"

K8S_ETCD_PORT="${K8S_ETCD_PORT:-42379}"
K8S_ETCD_PEER_PORT="${K8S_ETCD_PEER_PORT:-42380}"
K8S_API_PORT="${K8S_API_PORT:-46443}"
K8S_SCHED_PORT="${K8S_SCHED_PORT:-40259}"
K8S_CM_PORT="${K8S_CM_PORT:-10257}"
K8S_AUTHZ_MODE="${K8S_AUTHZ_MODE:-RBAC}"
K8S_DISABLE_ADMISSION="${K8S_DISABLE_ADMISSION-ServiceAccount,TaintNodesByCondition}"
K8S_SERVICE_CIDR="${K8S_SERVICE_CIDR:-10.96.0.0/16}"
K8S_APISERVER_V="${K8S_APISERVER_V:-1}"
K8S_SCHEDULER_V="${K8S_SCHEDULER_V:-2}"
K8S_CM_V="${K8S_CM_V:-1}"
K8S_CONTROLLER_MANAGER="${K8S_CONTROLLER_MANAGER:-true}"
K8S_CM_CONTROLLERS="${K8S_CM_CONTROLLERS:-*,-node-lifecycle-controller,-node-ipam-controller,-node-route-controller,-cloud-node-lifecycle-controller,-service-lb-controller}"
K8S_START_TIMEOUT="${K8S_START_TIMEOUT:-120}"

EXTENDER_ENABLED="${EXTENDER_ENABLED:-true}"
EXTENDER_URL_PREFIX="${EXTENDER_URL_PREFIX:-http://127.0.0.1:39999/gpushare-scheduler}"
EXTENDER_FILTER_VERB="${EXTENDER_FILTER_VERB-filter}"
EXTENDER_PRIORITIZE_VERB="${EXTENDER_PRIORITIZE_VERB-prioritize}"
EXTENDER_BIND_VERB="${EXTENDER_BIND_VERB-bind}"
EXTENDER_PREEMPT_VERB="${EXTENDER_PREEMPT_VERB-}"
EXTENDER_WEIGHT="${EXTENDER_WEIGHT:-1}"
EXTENDER_NODE_CACHE_CAPABLE="${EXTENDER_NODE_CACHE_CAPABLE:-false}"
EXTENDER_MANAGED_RESOURCES="${EXTENDER_MANAGED_RESOURCES-aliyun.com/gpu-mem}"
EXTENDER_IGNORED_BY_SCHEDULER="${EXTENDER_IGNORED_BY_SCHEDULER:-false}"
EXTENDER_IGNORABLE="${EXTENDER_IGNORABLE:-false}"
EXTENDER_HTTP_TIMEOUT="${EXTENDER_HTTP_TIMEOUT:-}"
EXTENDER_TLS_CA_FILE="${EXTENDER_TLS_CA_FILE:-}"
EXTENDER_TLS_CERT_FILE="${EXTENDER_TLS_CERT_FILE:-}"
EXTENDER_TLS_KEY_FILE="${EXTENDER_TLS_KEY_FILE:-}"
K8S_SCHEDULER_EXTENDERS="${K8S_SCHEDULER_EXTENDERS:-}"

# in stop order; stop tries every component that has a pid file
COMPONENTS_STOP=(kube-controller-manager kube-scheduler kube-apiserver etcd)

die() { echo "k8s-up: $*" >&2; exit 1; }
log() { echo "k8s-up: $*" >&2; }

usage() {
  sed -n '7,23p' "$0" >&2
  exit 2
}

# --- process bookkeeping -----------------------------------------------------

# pid_alive PIDFILE NAME -> 0 if the recorded PID is alive and is still NAME
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
  local dir="$1" name="$2" pidfile pid i
  pidfile="$dir/pids/$name.pid"
  [[ -f "$pidfile" ]] || return 0
  pid="$(cat "$pidfile")"
  if pid_alive "$pidfile" "$name"; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      pid_alive "$pidfile" "$name" || break
      sleep 0.1
    done
    if pid_alive "$pidfile" "$name"; then
      log "$name (pid $pid) did not exit after SIGTERM, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
  else
    log "$name: recorded pid $pid is not running (or is no longer $name)"
  fi
  rm -f "$pidfile"
}

# launch DIR NAME BINARY ARGS... -> runs detached, records its PID
launch() {
  local dir="$1" name="$2"; shift 2
  local pid i
  nohup "$@" > "$dir/logs/$name.log" 2>&1 < /dev/null &
  pid=$!
  echo "$pid" > "$dir/pids/$name.pid"
  # wait until nohup has exec'd the real binary, so pid_alive sees its name
  for ((i = 0; i < 50; i++)); do
    pid_alive "$dir/pids/$name.pid" "$name" && break
    [[ -d "/proc/$pid" ]] || break
    sleep 0.1
  done
  log "started $name (pid $pid) log: $dir/logs/$name.log"
}

# wait_for NAME WHAT DIR CHECK-COMMAND...
wait_for() {
  local name="$1" what="$2" dir="$3"; shift 3
  local deadline=$((SECONDS + K8S_START_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! pid_alive "$dir/pids/$name.pid" "$name"; then
      tail -n 40 "$dir/logs/$name.log" >&2 || true
      die "$name exited during start-up (see $dir/logs/$name.log)"
    fi
    if "$@" > /dev/null 2>&1; then
      log "$name: $what"
      return 0
    fi
    sleep 0.5
  done
  tail -n 40 "$dir/logs/$name.log" >&2 || true
  die "$name not ready after ${K8S_START_TIMEOUT}s (see $dir/logs/$name.log)"
}

port_free() {
  # true if nothing listens on 127.0.0.1:$1
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# --- files ---------------------------------------------------------------------

gen_pki() {
  local pki="$1"
  mkdir -p "$pki"
  (
    cd "$pki"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
      -subj "/CN=k8s-harness-ca" -keyout ca.key -out ca.crt 2> /dev/null
    cat > server-ext.cnf << 'EOF'
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc
EOF
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=kube-apiserver" \
      -keyout apiserver.key -out apiserver.csr 2> /dev/null
    openssl x509 -req -sha256 -days 3650 -in apiserver.csr -CA ca.crt -CAkey ca.key \
      -CAcreateserial -extfile server-ext.cnf -out apiserver.crt 2> /dev/null
    # front-proxy (requestheader) CA: only so that the extension-apiserver-authentication
    # ConfigMap is complete and kube-scheduler's delegated authn does not log errors
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
      -subj "/CN=k8s-harness-front-proxy-ca" -keyout front-proxy-ca.key -out front-proxy-ca.crt 2> /dev/null
    # service-account token signing key pair
    openssl genrsa -out sa.key 2048 2> /dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2> /dev/null
  )
}

write_kubeconfig() {
  local path="$1" ca="$2" token="$3" ca_b64
  ca_b64="$(base64 -w0 < "$ca")"
  mkdir -p "$(dirname "$path")"
  (
    umask 077
    cat > "$path" << EOF
apiVersion: v1
kind: Config
clusters:
- name: harness
  cluster:
    server: https://127.0.0.1:${K8S_API_PORT}
    certificate-authority-data: ${ca_b64}
users:
- name: admin
  user:
    token: ${token}
contexts:
- name: harness
  context:
    cluster: harness
    user: admin
    namespace: default
current-context: harness
EOF
  )
}

write_scheduler_config() {
  local path="$1" kubeconfig="$2"
  {
    cat << EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: "${kubeconfig}"
EOF
    if [[ -n "${K8S_SCHEDULER_QPS:-}" ]]; then
      echo "  qps: ${K8S_SCHEDULER_QPS}"
      echo "  burst: ${K8S_SCHEDULER_BURST:-${K8S_SCHEDULER_QPS}}"
    fi
    cat << EOF
leaderElection:
  leaderElect: false
EOF
    if [[ -n "$K8S_SCHEDULER_EXTENDERS" ]]; then
      echo "extenders: ${K8S_SCHEDULER_EXTENDERS}"
    elif [[ "$EXTENDER_ENABLED" == "true" ]]; then
      echo "extenders:"
      echo "- urlPrefix: \"${EXTENDER_URL_PREFIX}\""
      if [[ -n "$EXTENDER_FILTER_VERB" ]]; then echo "  filterVerb: \"${EXTENDER_FILTER_VERB}\""; fi
      if [[ -n "$EXTENDER_PRIORITIZE_VERB" ]]; then echo "  prioritizeVerb: \"${EXTENDER_PRIORITIZE_VERB}\""; fi
      if [[ -n "$EXTENDER_BIND_VERB" ]]; then echo "  bindVerb: \"${EXTENDER_BIND_VERB}\""; fi
      if [[ -n "$EXTENDER_PREEMPT_VERB" ]]; then echo "  preemptVerb: \"${EXTENDER_PREEMPT_VERB}\""; fi
      echo "  weight: ${EXTENDER_WEIGHT}"
      if [[ "$EXTENDER_URL_PREFIX" == https://* ]]; then
        echo "  enableHTTPS: true"
        echo "  tlsConfig:"
        if [[ -n "$EXTENDER_TLS_CA_FILE" ]]; then echo "    caFile: \"${EXTENDER_TLS_CA_FILE}\""; fi
        if [[ -n "$EXTENDER_TLS_CERT_FILE" ]]; then echo "    certFile: \"${EXTENDER_TLS_CERT_FILE}\""; fi
        if [[ -n "$EXTENDER_TLS_KEY_FILE" ]]; then echo "    keyFile: \"${EXTENDER_TLS_KEY_FILE}\""; fi
        if [[ -z "$EXTENDER_TLS_CA_FILE" ]]; then echo "    insecure: true"; fi
      else
        echo "  enableHTTPS: false"
      fi
      echo "  nodeCacheCapable: ${EXTENDER_NODE_CACHE_CAPABLE}"
      echo "  ignorable: ${EXTENDER_IGNORABLE}"
      if [[ -n "$EXTENDER_HTTP_TIMEOUT" ]]; then echo "  httpTimeout: ${EXTENDER_HTTP_TIMEOUT}"; fi
      if [[ -n "$EXTENDER_MANAGED_RESOURCES" ]]; then
        echo "  managedResources:"
        local r
        IFS=',' read -r -a _res <<< "$EXTENDER_MANAGED_RESOURCES"
        for r in "${_res[@]}"; do
          r="${r// /}"
          [[ -n "$r" ]] || continue
          echo "  - name: \"${r}\""
          echo "    ignoredByScheduler: ${EXTENDER_IGNORED_BY_SCHEDULER}"
        done
      fi
    fi
  } > "$path"
}

# --- commands --------------------------------------------------------------------

start_scheduler() {
  local dir="$1" kubeconfig="$2"
  local -a sched_args=(
    --config "$dir/scheduler-config.yaml"
    --bind-address 127.0.0.1
    --secure-port "${K8S_SCHED_PORT}"
    --cert-dir "$dir/scheduler-certs"
    --authentication-kubeconfig "$kubeconfig"
    --authorization-kubeconfig "$kubeconfig"
    --v "${K8S_SCHEDULER_V}"
  )
  # shellcheck disable=SC2206
  if [[ -n "${K8S_SCHEDULER_EXTRA_ARGS:-}" ]]; then sched_args+=(${K8S_SCHEDULER_EXTRA_ARGS}); fi
  launch "$dir" kube-scheduler "$K8S_BIN_DIR/kube-scheduler" "${sched_args[@]}"
  wait_for kube-scheduler "healthz ok" "$dir" curl -fsSk "https://127.0.0.1:${K8S_SCHED_PORT}/healthz"
}

cmd_start() {
  local dir="$1" kubeconfig="${2:-}"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  kubeconfig="${kubeconfig:-$dir/kubeconfig}"
  case "$kubeconfig" in /*) ;; *) kubeconfig="$PWD/$kubeconfig" ;; esac

  local apiserver="$K8S_BIN_DIR/kube-apiserver" scheduler="$K8S_BIN_DIR/kube-scheduler"
  local cm="$K8S_BIN_DIR/kube-controller-manager"
  [[ -x "$apiserver" ]] || die "no kube-apiserver at $apiserver (set K8S_BIN_DIR)"
  [[ -x "$scheduler" ]] || die "no kube-scheduler at $scheduler (set K8S_BIN_DIR)"
  if [[ "$K8S_CONTROLLER_MANAGER" != "false" ]]; then
    [[ -x "$cm" ]] || die "no kube-controller-manager at $cm (set K8S_BIN_DIR, or K8S_CONTROLLER_MANAGER=false)"
  fi
  [[ -n "$ETCD_BIN" && -x "$ETCD_BIN" ]] || die "no etcd binary at '$ETCD_BIN' (set ETCD_BIN)"
  command -v openssl > /dev/null || die "openssl is needed"
  command -v curl > /dev/null || die "curl is needed"

  local c
  for c in "${COMPONENTS_STOP[@]}"; do
    if pid_alive "$dir/pids/$c.pid" "$c"; then
      die "$c already running from $dir (pid $(cat "$dir/pids/$c.pid")); run: $0 stop $dir"
    fi
  done
  local p
  local -a ports=("$K8S_ETCD_PORT" "$K8S_ETCD_PEER_PORT" "$K8S_API_PORT" "$K8S_SCHED_PORT")
  [[ "$K8S_CONTROLLER_MANAGER" == "false" ]] || ports+=("$K8S_CM_PORT")
  for p in "${ports[@]}"; do
    port_free "$p" || die "127.0.0.1:$p is already in use"
  done

  rm -rf "$dir/etcd-data" "$dir/pki" "$dir/logs" "$dir/pids" "$dir/scheduler-certs" \
    "$dir/controller-manager-certs" "$dir/env"
  mkdir -p "$dir/logs" "$dir/pids" "$dir/scheduler-certs" "$dir/controller-manager-certs"
  # if anything below fails, stop whatever this start already launched
  _START_DIR="$dir"
  trap 'rc=$?; if [[ $rc -ne 0 ]]; then log "start failed, stopping what was started"; cmd_stop "$_START_DIR"; fi' EXIT

  gen_pki "$dir/pki"
  local token="${K8S_ADMIN_TOKEN:-$(openssl rand -hex 24)}"
  (umask 077; echo "${token},admin,admin-uid,system:masters" > "$dir/pki/tokens.csv")
  write_kubeconfig "$kubeconfig" "$dir/pki/ca.crt" "$token"
  write_scheduler_config "$dir/scheduler-config.yaml" "$kubeconfig"

  # 1. etcd, fresh data dir every start
  mkdir -p "$dir/etcd-data" && chmod 700 "$dir/etcd-data"
  launch "$dir" etcd "$ETCD_BIN" \
    --name k8s-harness \
    --data-dir "$dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:${K8S_ETCD_PORT}" \
    --advertise-client-urls "http://127.0.0.1:${K8S_ETCD_PORT}" \
    --listen-peer-urls "http://127.0.0.1:${K8S_ETCD_PEER_PORT}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${K8S_ETCD_PEER_PORT}" \
    --initial-cluster "k8s-harness=http://127.0.0.1:${K8S_ETCD_PEER_PORT}" \
    --initial-cluster-state new \
    --quota-backend-bytes 1073741824
  wait_for etcd "healthy" "$dir" curl -fsS "http://127.0.0.1:${K8S_ETCD_PORT}/health"

  # 2. kube-apiserver
  local -a api_args=(
    --etcd-servers "http://127.0.0.1:${K8S_ETCD_PORT}"
    --bind-address 127.0.0.1
    --advertise-address 127.0.0.1
    --secure-port "${K8S_API_PORT}"
    --tls-cert-file "$dir/pki/apiserver.crt"
    --tls-private-key-file "$dir/pki/apiserver.key"
    --client-ca-file "$dir/pki/ca.crt"
    --requestheader-client-ca-file "$dir/pki/front-proxy-ca.crt"
    --requestheader-allowed-names front-proxy-client
    --requestheader-username-headers X-Remote-User
    --requestheader-group-headers X-Remote-Group
    --requestheader-extra-headers-prefix X-Remote-Extra-
    --token-auth-file "$dir/pki/tokens.csv"
    --authorization-mode "${K8S_AUTHZ_MODE}"
    --service-account-issuer https://kubernetes.default.svc
    --service-account-key-file "$dir/pki/sa.pub"
    --service-account-signing-key-file "$dir/pki/sa.key"
    --service-cluster-ip-range "${K8S_SERVICE_CIDR}"
    --endpoint-reconciler-type none
    --cert-dir "$dir/pki"
    --profiling=false
    --v "${K8S_APISERVER_V}"
  )
  if [[ -n "$K8S_DISABLE_ADMISSION" ]]; then api_args+=(--disable-admission-plugins "$K8S_DISABLE_ADMISSION"); fi
  # shellcheck disable=SC2206
  if [[ -n "${K8S_APISERVER_EXTRA_ARGS:-}" ]]; then api_args+=(${K8S_APISERVER_EXTRA_ARGS}); fi
  launch "$dir" kube-apiserver "$apiserver" "${api_args[@]}"
  wait_for kube-apiserver "readyz ok" "$dir" curl -fsS --cacert "$dir/pki/ca.crt" \
    -H "Authorization: Bearer ${token}" "https://127.0.0.1:${K8S_API_PORT}/readyz"
  # the bootstrap controller creates the "default" namespace shortly after readyz
  wait_for kube-apiserver "namespace default exists" "$dir" curl -fsS --cacert "$dir/pki/ca.crt" \
    -H "Authorization: Bearer ${token}" "https://127.0.0.1:${K8S_API_PORT}/api/v1/namespaces/default"

  # 3. kube-scheduler
  start_scheduler "$dir" "$kubeconfig"

  # 4. kube-controller-manager (optional)
  if [[ "$K8S_CONTROLLER_MANAGER" != "false" ]]; then
    local -a cm_args=(
      --kubeconfig "$kubeconfig"
      --authentication-kubeconfig "$kubeconfig"
      --authorization-kubeconfig "$kubeconfig"
      --bind-address 127.0.0.1
      --secure-port "${K8S_CM_PORT}"
      --cert-dir "$dir/controller-manager-certs"
      --leader-elect=false
      --controllers "${K8S_CM_CONTROLLERS}"
      --service-account-private-key-file "$dir/pki/sa.key"
      --root-ca-file "$dir/pki/ca.crt"
      --cluster-signing-cert-file "$dir/pki/ca.crt"
      --cluster-signing-key-file "$dir/pki/ca.key"
      --v "${K8S_CM_V}"
    )
    # shellcheck disable=SC2206
    if [[ -n "${K8S_CM_EXTRA_ARGS:-}" ]]; then cm_args+=(${K8S_CM_EXTRA_ARGS}); fi
    launch "$dir" kube-controller-manager "$cm" "${cm_args[@]}"
    wait_for kube-controller-manager "healthz ok" "$dir" curl -fsSk "https://127.0.0.1:${K8S_CM_PORT}/healthz"
  fi

  cat > "$dir/env" << EOF
export KUBECONFIG='${kubeconfig}'
export K8S_API_URL='https://127.0.0.1:${K8S_API_PORT}'
export K8S_TOKEN='${token}'
export K8S_CA_FILE='$dir/pki/ca.crt'
export K8S_API_PORT='${K8S_API_PORT}'
export K8S_SCHED_PORT='${K8S_SCHED_PORT}'
EOF
  chmod 600 "$dir/env"
  trap - EXIT
  log "control plane up: KUBECONFIG=$kubeconfig  (env: $dir/env)"
  echo "$kubeconfig"
}

cmd_stop() {
  local dir="$1" c
  [[ -d "$dir" ]] || die "no such directory: $dir"
  for c in "${COMPONENTS_STOP[@]}"; do
    stop_one "$dir" "$c"
  done
}

cmd_reconfigure_scheduler() {
  local dir="$1"
  [[ -f "$dir/env" ]] || die "no $dir/env: run $0 start $dir first"
  dir="$(cd "$dir" && pwd)"
  # shellcheck disable=SC1091
  . "$dir/env"
  stop_one "$dir" kube-scheduler
  write_scheduler_config "$dir/scheduler-config.yaml" "$KUBECONFIG"
  start_scheduler "$dir" "$KUBECONFIG"
}

cmd_stop_scheduler() {
  local dir="$1"
  [[ -d "$dir" ]] || die "no such directory: $dir"
  stop_one "$dir" kube-scheduler
}

cmd_status() {
  local dir="$1" c rc=0
  for c in etcd kube-apiserver kube-scheduler kube-controller-manager; do
    if [[ "$c" == kube-controller-manager && ! -f "$dir/pids/$c.pid" ]]; then
      echo "$c not started"
    elif pid_alive "$dir/pids/$c.pid" "$c"; then
      echo "$c running (pid $(cat "$dir/pids/$c.pid"))"
    else
      echo "$c not running"
      rc=1
    fi
  done
  return $rc
}

[[ $# -ge 2 ]] || usage
case "$1" in
  start) cmd_start "$2" "${3:-}" ;;
  stop) cmd_stop "$2" ;;
  status) cmd_status "$2" ;;
  reconfigure-scheduler) cmd_reconfigure_scheduler "$2" ;;
  stop-scheduler) cmd_stop_scheduler "$2" ;;
  *) usage ;;
esac
