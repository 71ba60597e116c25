#!/usr/bin/env bash
# The production build of kube-cache-proxy: exactly what the image runs.
# The Dockerfile's build stage runs this script, and so does .ci/run on
# every change, so CI proves the image's build step (Docker itself is not
# needed).
#
#   build/release.sh [DEST]
#
# Builds the `image` profile (Cargo.toml: the release profile, thin LTO,
# stripped, no debug info) of the kube-cache-proxy binary only, --locked,
# without default features (no `demo`: the simulated apiserver is not
# linked), then checks the result:
#   - the simulator is neither in the dependency graph (cargo tree) nor in
#     the binary (no string names kube_apiserver_sim, no `demo` subcommand);
#   - jemalloc carries the options of .cargo/config.toml;
#   - the binary runs (`--version`) and is within the size budget
#     (MAX_BYTES, default 24 MiB: 69 MiB unstripped, ~18 MiB stripped);
# and prints its path and size. With DEST, installs it there (mode 0755).
#
# The git commit for kube_cache_proxy_build_info comes from
# KUBE_CACHE_PROXY_GIT_COMMIT, else from `git rev-parse HEAD` when this is a
# git checkout (the Docker build passes it as the GIT_COMMIT build argument).
# Needs only cargo (cargo-chef, in the Dockerfile, only pre-builds the
# dependencies of this same command).
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_BYTES=${MAX_BYTES:-$((24 * 1024 * 1024))}
target=${CARGO_TARGET_DIR:-target}
dest=${1:-}

if [ -z "${KUBE_CACHE_PROXY_GIT_COMMIT:-}" ] && git rev-parse --verify -q HEAD >/dev/null 2>&1; then
    KUBE_CACHE_PROXY_GIT_COMMIT=$(git rev-parse HEAD)
    export KUBE_CACHE_PROXY_GIT_COMMIT
fi

fail() {
    echo "build/release.sh: $*" >&2
    exit 1
}

cargo build --locked --profile image -p kube-cache-proxy --no-default-features --bin kube-cache-proxy
bin=$target/image/kube-cache-proxy

# No simulator: not a dependency of the production build...
# (Each tool's whole output is read first: under pipefail, `grep -q`
# closing a pipe early makes the writer's SIGPIPE fail the test.)
deps=$(cargo tree --locked -p kube-cache-proxy --no-default-features -e normal --prefix none)
if grep -q '^kube-apiserver-sim ' <<<"$deps"; then
    fail "kube-apiserver-sim is a dependency of the production build"
fi
# ... and not in the binary.
if grep -a -q kube_apiserver_sim "$bin"; then
    fail "$bin holds code of kube_apiserver_sim"
fi
help=$("$bin" --help)
if grep -qE '^  demo( |$)' <<<"$help"; then
    fail "$bin has the demo subcommand"
fi
# jemalloc with the project's build-time options (.cargo/config.toml):
# without them (a build outside this checkout), large lists' buffers stay
# resident for seconds after they are sent.
conf=$(sed -n 's/^JEMALLOC_SYS_WITH_MALLOC_CONF = "\(.*\)"$/\1/p' .cargo/config.toml)
if [ -z "$conf" ] || ! grep -a -q -F "$conf" "$bin"; then
    fail "$bin lacks jemalloc's options from .cargo/config.toml (${conf:-none found})"
fi
version=$("$bin" --version) || fail "$bin does not run"
bytes=$(stat -c %s "$bin")
if [ "$bytes" -gt "$MAX_BYTES" ]; then
    fail "$bin is $bytes bytes, over the budget of $MAX_BYTES (not stripped?)"
fi
echo "build/release.sh: $bin: $version, $bytes bytes ($((bytes / 1024)) KiB), stripped, no simulator, commit ${KUBE_CACHE_PROXY_GIT_COMMIT:-unknown}"
if [ -n "$dest" ]; then
    install -m 0755 "$bin" "$dest"
fi
