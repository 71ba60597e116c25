#!/usr/bin/env bash
# Tests kube-cache-proxy: everything CI runs (.ci/run calls this), as the
# README's one test command.
#
#   build/test.sh
#
# 1. Installs what the tests need when missing, from Debian's packages
#    (apt-get, as root or with sudo): make (jemalloc's build), promtool
#    (prometheus: a real scrape and the alert rules), HAProxy (the
#    robustness run's and the HA test's balancer), iproute2 and util-linux
#    (a pod's network and mount namespaces), kubectl (kubernetes-client,
#    where no kubectl is installed), python3-venv (the Python client, from
#    PyPI). The real control plane comes from ../shared/k8s/ (or
#    $KUBEBUILDER_ASSETS).
# 2. Runs, timing each stage: cargo fmt --check; clippy (every target);
#    cargo test of the workspace (the real-apiserver tests against
#    kube-apiserver 1.36); build/version-matrix.sh (against 1.34 and 1.35,
#    what it says); the image's build step (build/release.sh, warnings
#    denied); .ci/validate-manifests.
#
# Every test that cannot run here (a binary, a tool, a privilege, a
# version missing) fails, naming what it lacks (KUBE_CACHE_PROXY_REQUIRE_ALL,
# kube_testenv::skip); set KUBE_CACHE_PROXY_REQUIRE_ALL=0 to let such tests
# skip, and the skips are tallied at the end. About 37 minutes on 2 cores
# from a clean clone.
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean build: incremental compilation only costs time and disk.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export KUBE_CACHE_PROXY_REQUIRE_ALL=${KUBE_CACHE_PROXY_REQUIRE_ALL:-1}
skips=$(mktemp)
export KUBE_CACHE_PROXY_SKIP_LOG=$skips

missing=()
command -v make >/dev/null || missing+=(make)
command -v promtool >/dev/null || missing+=(prometheus)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v ip >/dev/null || [ -x /usr/sbin/ip ] || missing+=(iproute2)
command -v unshare >/dev/null || missing+=(util-linux)
command -v kubectl >/dev/null || missing+=(kubernetes-client)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]} (apt-get)"
    sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
promtool --version 2>&1 | sed -n 1p
haproxy=$(command -v haproxy || echo /usr/sbin/haproxy)
"$haproxy" -v 2>&1 | sed -n 1p
kubectl version --client 2>&1 | sed -n 1p

stages=()
stage() {
    local name=$1
    shift
    echo "== $name"
    local start=$SECONDS
    "$@"
    stages+=("$(printf '%6d s  %s' $((SECONDS - start)) "$name")")
}

stage "cargo fmt --check" cargo fmt --all -- --check
stage "cargo clippy" cargo clippy --locked --workspace --all-targets --all-features -- -D warnings
stage "cargo test (the real-apiserver tests against 1.36)" cargo test --locked --workspace --all-features
stage "the version matrix (1.34, 1.35)" build/version-matrix.sh
# The production build (the image's): the proxy without the demo feature,
# its warnings denied. Its code is a subset of what clippy checked above
# (nothing is compiled only without `demo`), so what it can add is code
# left unused without the demo (dead code, unused imports): rustc's
# warnings, which -D warnings turns into errors here at no extra build (a
# separate clippy of it took 79 s). Dependencies' warnings stay capped by
# cargo.
stage "the image's build step (build/release.sh, warnings denied)" env RUSTFLAGS="-D warnings" build/release.sh
stage "manifests (.ci/validate-manifests)" .ci/validate-manifests

echo "== time by stage"
printf '%s\n' "${stages[@]}"
if [ -s "$skips" ]; then
    echo "== not run here: $(wc -l < "$skips")"
    sort "$skips" | uniq -c | sort -rn
fi
rm -f "$skips"
