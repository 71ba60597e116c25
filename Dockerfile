# kube-cache-proxy image: the production build (build/release.sh, the same
# script .ci/run runs on every change), run as a non-root user on a
# distroless base.
#
#   docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t kube-cache-proxy .
#
# Entrypoint: the binary. Ports: 6444 (HTTPS, clients), 9444 (HTTP, admin:
# /metrics /healthz /livez /readyz).
#
# Layers: cargo-chef turns the workspace's manifests, targets and
# Cargo.lock into a recipe, and `cargo chef cook` compiles every dependency
# with the flags build/release.sh uses (profile `image`, --locked, the
# proxy package without default features), in a layer that changes only
# when a manifest or the lock file does; a source change recompiles only
# the workspace's own crates.

FROM rust:1.95-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.78
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=planner /src/recipe.json recipe.json
# jemalloc's build-time options (read when tikv-jemalloc-sys is built).
COPY .cargo/ .cargo/
RUN cargo chef cook --locked --profile image -p kube-cache-proxy --no-default-features \
    --bin kube-cache-proxy --recipe-path recipe.json
COPY . .
# Without the default `demo` feature (the image carries no simulated
# apiserver), stripped; the script checks both and the size.
ARG GIT_COMMIT=""
RUN KUBE_CACHE_PROXY_GIT_COMMIT="${GIT_COMMIT}" build/release.sh /kube-cache-proxy

# glibc and libgcc_s, which the binary links dynamically (the gnu target),
# CA certificates, no shell; uid/gid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /kube-cache-proxy /usr/local/bin/kube-cache-proxy
USER 65532:65532
EXPOSE 6444 9444 9445
ENTRYPOINT ["/usr/local/bin/kube-cache-proxy"]
