# syntax=docker/dockerfile:1
# h3-ingress: one static binary on a distroless base, run as a non-root user.
#
#   docker build -t ghcr.io/h3-ingress/h3-ingress:0.1.0 --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
#
# That reference is the chart's and the operator's default (the version is Cargo.toml's and the
# chart's appVersion; a test holds them together). It is not published yet: tag the image for
# your registry instead, push it, and set the chart's image.repository (docs/image.md).
# scripts/release.sh does all of it with a tag per build, VERSION-COMMIT, and packages the chart
# with that appVersion, so nodes never keep a cached image of another build under one tag.
#
# REVISION is also stamped into the binary (`h3-ingress --version`, /status, build_info): the
# build context has no .git. Without it the binary reports commit "unknown".
#
# The build stage runs scripts/build-static.sh, the same script the test command runs, so the
# build step is exercised without a Docker engine (tests/observe/dockerfile_check.py).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
ARG REVISION=unknown
WORKDIR /src
COPY . .
# Cache mounts keep the registry and incremental builds between image builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    H3I_GIT_COMMIT="${REVISION}" scripts/build-static.sh /out/h3-ingress

# distroless/static: no shell, no package manager, no libc; it does carry the CA bundle that
# `upstream.verify: system` reads, /etc/passwd with the nonroot user, and tzdata.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="h3-ingress" \
      org.opencontainers.image.description="HTTP/3 in front of a Kubernetes cluster's existing TCP ingress" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"
COPY --from=build /out/h3-ingress /h3-ingress
# 65532 is distroless's "nonroot". The data plane binds UDP 443 with CAP_NET_BIND_SERVICE,
# which the operator grants in the DaemonSet's security context; nothing here needs root.
USER 65532:65532
ENTRYPOINT ["/h3-ingress"]
CMD ["--help"]
