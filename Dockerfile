# wsr-gateway in a container (README "Run it in a container"). The binary is built outside,
# on Debian 12 (glibc), and copied in:
#
#   cargo build --release --locked
#   podman build --format docker -t wsr-gateway .      # or: docker build -t wsr-gateway .
#
# `--format docker` keeps the HEALTHCHECK (the OCI image format has none; podman warns and
# drops it otherwise). Docker needs BuildKit (its default since 23.0) for COPY --chmod. CI (.ci/container-smoke) copies the debug build instead:
# `--build-arg BINARY=target/debug/wsr-gateway`.
#
# BASE is any Debian-like image with glibc 2.34 or later: bookworm-slim by default. The CA
# certificates are installed from the base's own apt sources, so the build needs the Debian
# mirror; where the build's containers cannot reach it (a sandbox without a bridge network),
# `podman build --network host` gives them the host's. A base that already ships
# /etc/ssl/certs/ca-certificates.crt (e.g. one made with
# `debootstrap --include=ca-certificates`) needs no network at all: the step is skipped.
ARG BASE=debian:bookworm-slim
FROM ${BASE}

ARG BASE
ARG BINARY=target/release/wsr-gateway

LABEL org.opencontainers.image.title="wsr-gateway" \
      org.opencontainers.image.description="A WS-Reliability 1.1 gateway: receiving and sending RMP over SOAP 1.1/1.2 on HTTP" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE}"

# CA certificates (the system roots for partners, services and webhooks reached over https
# without their own ca_file; the gateway starts without them when nothing needs them), and
# the gateway's own user: numeric ids, no shell, no home of its own but its data folder.
RUN set -eu; \
    if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then \
        export DEBIAN_FRONTEND=noninteractive; \
        apt-get update -qq; \
        apt-get install -y -qq --no-install-recommends ca-certificates >/dev/null; \
        apt-get clean; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    groupadd --gid 10001 wsr-gateway; \
    useradd --uid 10001 --gid 10001 --no-create-home \
        --home-dir /var/lib/wsr-gateway --shell /usr/sbin/nologin wsr-gateway; \
    install -d -o 10001 -g 10001 -m 0750 /var/lib/wsr-gateway; \
    install -d -o root -g 10001 -m 0750 /etc/wsr-gateway

COPY --chmod=0755 ${BINARY} /usr/local/bin/wsr-gateway
# No secret in it: the partner's password and the API token come from the environment.
COPY --chown=0:10001 --chmod=0640 examples/container/gateway.toml /etc/wsr-gateway/gateway.toml
RUN wsr-gateway --version

# The SQLite store (and the receipts' key) live here: mount a volume on it.
VOLUME /var/lib/wsr-gateway
WORKDIR /var/lib/wsr-gateway
USER 10001:10001

# `wsr-gateway health` asks WSR_API's /readyz (a client variable: `serve` ignores it). Set it
# to where the gateway listens if WSR_LISTEN moves it.
ENV WSR_API=http://127.0.0.1:8080
# The configuration for the store commands run in the container (`podman exec … backup`,
# `check-store`): they read its `database`.
ENV WSR_CONFIG=/etc/wsr-gateway/gateway.toml
EXPOSE 8080
# SIGTERM drains: no new connections, requests in flight answered (at most 5 s), the writer
# commits what it holds, exit 0. Give it that long (`podman stop -t 30`).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["wsr-gateway", "health"]

ENTRYPOINT ["wsr-gateway"]
CMD ["serve", "--config", "/etc/wsr-gateway/gateway.toml"]
