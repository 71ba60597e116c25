# kube-cache-proxy image: a reproducible (--locked) release build, run as a
# non-root user on a minimal base.
#
#   docker build -t kube-cache-proxy .
#
# Entrypoint: the binary. Ports: 6444 (HTTPS, clients), 9444 (HTTP, admin:
# /metrics /healthz /livez /readyz).

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so source changes do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo fetch --locked
COPY . .
RUN cargo build --release --locked --bin kube-cache-proxy \
    && install -m 0755 target/release/kube-cache-proxy /kube-cache-proxy

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /kube-cache-proxy /usr/local/bin/kube-cache-proxy
USER 65532:65532
EXPOSE 6444 9444
ENTRYPOINT ["/usr/local/bin/kube-cache-proxy"]
