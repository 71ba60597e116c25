#!/usr/bin/env bash
# The version matrix: the real-apiserver tests (tests/real/ and tests/real_isolated/: every
# representation, resourceVersion rules, streaming lists, consistent
# reads, pagination, compaction, authorization, hollow kubelets, the short
# robustness run; the few left out are listed below, with why) against each
# older supported kube-apiserver minor
# version, one run per version, the control plane's etcd and kubemark
# staying the newest's. `cargo test` runs them against the newest
# (v1.36); this runs 1.34 and 1.35, or the versions given:
#
#   build/version-matrix.sh [1.34 1.35 ...]
#
# The binaries come from ../shared/k8s/kubernetes-v<version>.*-linux-amd64.tar.xz,
# or from setup-envtest's directories beside $KUBEBUILDER_ASSETS
# (<version>.<patch>-linux-amd64). A version not at hand fails every
# real-apiserver test, naming it (KUBE_CACHE_PROXY_REQUIRE_ALL, set here:
# kube_testenv::skip): a matrix that passes has run.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(1.34 1.35)
# The real-apiserver tests are two test binaries: the tests that share a
# control plane (`real`), and those with one each (`real_isolated`).
tests=(--test real --test real_isolated)
# Left out of the older versions' runs, each for a reason (CI's 40-minute
# budget is made of these; issue 61): tests whose subject is the proxy's own
# machinery, whose apiserver calls `real` and the rest of `real_isolated`
# already cover at every version, and which take minutes each:
# - ha:: (client-side balancing and HAProxy failover: the proxy's dialer);
# - pods:: (a pod's network namespace reaching its node proxy: the proxy's
#   listeners; the in-pod clients' reads are tables/clients of `real`);
# - autonomy:: (a node rebooted during an outage: the proxy's snapshots);
# - kubemark::a_deployment (the newest's scheduler and controller-manager,
#   which must not be newer than the apiserver: a skew Kubernetes does not
#   support).
skips=(--skip ha:: --skip pods:: --skip autonomy:: --skip kubemark::a_deployment)
# 1.34, the oldest, differs most from the newest: every other test runs
# against it, the short robustness run included (its rolling upgrade goes
# to 1.35). 1.35 sits between two versions that run everything: `real`
# whole, and of `real_isolated` the behaviours that changed across these
# versions: streaming lists and their bookmarks (streams::), exact reads
# past compaction (compaction::), watch resumption and 410 Gone
# (resumes::), constrained impersonation (least_privilege::). Its
# apiservers also serve in the newest's robustness run, whose rolling
# upgrade goes from 1.36 to 1.35.
between=(streams:: compaction:: resumes:: least_privilege::)
export KUBE_CACHE_PROXY_REQUIRE_ALL=${KUBE_CACHE_PROXY_REQUIRE_ALL:-1}
for v in "${versions[@]}"; do
    echo "== the real-apiserver tests against kube-apiserver $v"
    start=$SECONDS
    export KUBE_TESTENV_APISERVER_VERSION=$v
    if [ "$v" = 1.35 ]; then
        cargo test --locked --all-features --test real
        cargo test --locked --all-features --test real_isolated -- "${between[@]}"
    else
        cargo test --locked --all-features "${tests[@]}" -- "${skips[@]}"
    fi
    echo "== kube-apiserver $v: $((SECONDS - start)) s"
done
