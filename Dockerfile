# kube-cache-proxy image: a reproducible (--locked) release build, run as a
# non-root user on a minimal base.
#
#   docker build -t kube-cache-proxy .
#
# Entrypoint: the binary. Ports: 6444 (HTTPS, clients), 9444 (HTTP, admin:
# /metrics /healthz /livez /readyz).

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so source changes do not download them again. Cargo
# reads every workspace member's manifest, and each manifest's targets must
# exist, so each member gets its manifest and a stub of every target it
# names (the root's benches included). A new crate under crates/ needs its
# two lines here.
COPY Cargo.toml Cargo.lock ./
COPY crates/apimachinery/Cargo.toml crates/apimachinery/
COPY crates/kube-apiserver-sim/Cargo.toml crates/kube-apiserver-sim/
COPY crates/kcp-load/Cargo.toml crates/kcp-load/
RUN mkdir -p src benches crates/apimachinery/src crates/kube-apiserver-sim/src crates/kcp-load/src \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for b in ingest dispatch list selectors; do echo 'fn main() {}' > benches/$b.rs; done \
    && touch crates/apimachinery/src/lib.rs crates/kube-apiserver-sim/src/lib.rs \
    && echo 'fn main() {}' > crates/kcp-load/src/main.rs \
    && cargo fetch --locked
COPY . .
# Without the default `demo` feature: the image carries no simulated
# apiserver.
RUN cargo build --release --locked -p kube-cache-proxy --no-default-features --bin kube-cache-proxy \
    && install -m 0755 target/release/kube-cache-proxy /kube-cache-proxy

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /kube-cache-proxy /usr/local/bin/kube-cache-proxy
USER 65532:65532
EXPOSE 6444 9444
ENTRYPOINT ["/usr/local/bin/kube-cache-proxy"]
