#!/usr/bin/env bash
# Origin: the test harness's shared/k8s/install.sh, adapted for gpushare: --build runs the
# project's Go build (tests/k8s/build/build.sh of a source checkout) for missing binaries.
#
# install.sh - install from Debian what the scripts beside it need, and check that the
# Kubernetes binaries are in place.
#
#   install.sh [--kubelet] [--build]   # prints the directory holding the Kubernetes binaries
#
# Always: etcd (Debian's etcd-server) unless `etcd` is on PATH or $ETCD_BIN is set.
# --kubelet: containerd, runc and busybox-static, as kubelet-up.sh requires (root).
# --build: when a binary is missing (or was built for another version), build them with $GPUSHARE_K8S_BUILD (default: the source
#   checkout's tests/k8s/build/build.sh; Go 1.26 and the Go module proxy, 5-20 minutes once).
# Binaries: kube-apiserver, kube-scheduler, kube-controller-manager and kubelet are looked for
# in $K8S_BIN_DIR, else $GPUSHARE_K8S_BIN_DIR, else ~/.cache/gpushare/k8s. Without --build they
# are not made here: build them from the Kubernetes Go modules (`make k8s-bin`) or take them
# from an official release. Exit status 3 when any is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${K8S_BIN_DIR:-${GPUSHARE_K8S_BIN_DIR:-$HOME/.cache/gpushare/k8s}}"
kubelet=false
build=false
for arg in "$@"; do
  case "$arg" in
    --kubelet) kubelet=true ;;
    --build) build=true ;;
    *) sed -n '5,18p' "$0" >&2; exit 2 ;;
  esac
done
need=()
[ -n "${ETCD_BIN:-}" ] || command -v etcd >/dev/null || [ -x "$dest/etcd" ] || need+=(etcd-server)
if $kubelet; then
  command -v containerd >/dev/null || need+=(containerd)
  command -v runc >/dev/null || need+=(runc)
  [ -x /bin/busybox ] || need+=(busybox-static)
fi
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi
missing() {
  local b
  for b in kube-apiserver kube-scheduler kube-controller-manager kubelet; do
    [ -x "$dest/$b" ] || echo "$b"
  done
}
# a directory the build made (it has a VERSION file) is handed to the build again, which
# rebuilds only when the version it pins differs; release binaries are only checked
if $build && { [ -n "$(missing)" ] || [ -f "$dest/VERSION" ]; }; then
  builder="${GPUSHARE_K8S_BUILD:-$here/../../../../tests/k8s/build/build.sh}"
  [ -f "$builder" ] || { echo "install.sh: no build script at $builder (set GPUSHARE_K8S_BUILD)" >&2; exit 3; }
  GPUSHARE_K8S_BIN_DIR="$dest" bash "$builder" >&2
fi
absent="$(missing | tr '\n' ' ')"
if [ -n "$absent" ]; then
  echo "install.sh: missing in $dest: ${absent}(build them with \`make k8s-bin\`, or point GPUSHARE_K8S_BIN_DIR at release binaries)" >&2
  exit 3
fi
echo "$dest"
