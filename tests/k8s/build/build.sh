#!/usr/bin/env bash
# Builds kube-apiserver, kube-scheduler, kube-controller-manager, kubelet and kubectl
# from the k8s.io/kubernetes Go module (go.mod beside this script) into
# $GPUSHARE_K8S_BIN_DIR (default ~/.cache/gpushare/k8s), unless they are already there
# at this version. Prints the directory. Nothing is committed; nothing but the Go
# module proxy is used.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$here/go.mod")"
bin_dir="${GPUSHARE_K8S_BIN_DIR:-$HOME/.cache/gpushare/k8s}"
components=(kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl)

built() {
    [ "$(cat "$bin_dir/VERSION" 2>/dev/null)" = "$version" ] || return 1
    for c in "${components[@]}"; do [ -x "$bin_dir/$c" ] || return 1; done
}

if built && [ "${1:-}" != "--force" ]; then
    echo "$bin_dir"
    exit 0
fi

go_version="$(go env GOVERSION)"
case "$go_version" in
    go1.26*) ;;
    *) echo "build.sh: needs Go 1.26 (found $go_version; Go 1.27's jsonv2 breaks the apiserver's OpenAPI)" >&2
       exit 2 ;;
esac

mkdir -p "$bin_dir"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitTreeState=clean"
    ldflags+=" -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$version" | cut -d. -f2)"
    ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
cd "$here"
started=$SECONDS
for c in "${components[@]}"; do
    echo "build.sh: building $c $version with $go_version" >&2
    CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "$ldflags" \
        -o "$bin_dir/$c.tmp" "k8s.io/kubernetes/cmd/$c"
    mv "$bin_dir/$c.tmp" "$bin_dir/$c"
done
echo "$version" >"$bin_dir/VERSION"
echo "build.sh: built in $((SECONDS - started)) s" >&2
echo "$bin_dir"
