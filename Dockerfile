# syntax=docker/dockerfile:1
# h3-ingress: one static binary on an empty base, run as a non-root user.
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
# The project's image is an image index for amd64 and arm64 nodes (Graviton, Ampere):
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t ghcr.io/h3-ingress/h3-ingress:0.1.0 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) --push .
#
# The build stage runs once per platform on the build machine's own platform (--platform=
# $BUILDPLATFORM, no emulation) and cross-compiles for TARGETARCH, exactly as
# `scripts/build-static.sh --arch amd64|arm64` does here; the runtime stage (scratch) is then
# that platform's image, and buildx pushes one manifest per platform under one index, as
# scripts/image.sh assembles it. A plain `docker build` makes the build machine's platform only.
#
# The build stage runs scripts/build-static.sh and scripts/image-rootfs.sh, the same scripts the
# test command runs, so the build step is exercised without a Docker engine
# (tests/observe/dockerfile_check.py). scripts/image.sh assembles this very image from their
# output without a Docker engine, and tests/observe/image_check.py fails when the runtime stage
# below and that image differ in any instruction.

ARG RUST_VERSION=1.95

FROM --platform=$BUILDPLATFORM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
ARG REVISION=unknown
# Set by BuildKit to the platform being built (amd64, arm64); empty means the build machine's.
ARG TARGETARCH
WORKDIR /src
COPY . .
# Another architecture than the build machine's needs Debian's cross C toolchain (the linker,
# static glibc, and the compiler of ring's C and assembly); the script names its packages.
RUN pkgs=$(scripts/build-static.sh --arch="${TARGETARCH}" --cross-packages) \
    && if [ -n "$pkgs" ]; then apt-get update -q && apt-get install -y -q --no-install-recommends $pkgs; fi
# Cache mounts keep the registry and incremental builds between image builds (one target
# directory; each architecture builds into its own triple under it).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    H3I_GIT_COMMIT="${REVISION}" scripts/build-static.sh --arch="${TARGETARCH}" /out/h3-ingress \
    && scripts/image-rootfs.sh /out/rootfs

# scratch plus scripts/image-rootfs.sh's few files: no shell, no package manager, no libc; the CA
# bundle that `upstream.verify: system` reads, /etc/passwd with the nonroot user, /tmp. Not a
# pulled base such as distroless/static: every byte of the image comes from this build, so
# scripts/image.sh can assemble the same image where no registry but our own is reachable.
FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="h3-ingress" \
      org.opencontainers.image.description="HTTP/3 in front of a Kubernetes cluster's existing TCP ingress" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/rootfs/ /
COPY --from=build /out/h3-ingress /h3-ingress
# 65532 is "nonroot" in the image's /etc/passwd (distroless's uid too). The data plane binds
# UDP 443 with CAP_NET_BIND_SERVICE, which the operator grants in the DaemonSet's security
# context; nothing here needs root.
USER 65532:65532
ENTRYPOINT ["/h3-ingress"]
CMD ["--help"]
