# syntax=docker/dockerfile:1
# The image the DaemonSet and the Helm chart run, ghcr.io/gantry-gpu/gantry:
#
#   docker build -t ghcr.io/gantry-gpu/gantry:0.1.0 \
#       --build-arg VERSION=$(git describe --tags --always --dirty) .
#
# `make image` (scripts/build-image.sh) builds the same image without a
# registry or Docker: from this machine's build and its glibc.
#
# /usr/bin holds the binaries, built as `make build` builds them
# (cgo but for the static CDI hook, -trimpath, the version stamped) and
# stripped (-s -w):
#   gantry-device-plugin   what the DaemonSet runs (the entrypoint)
#   gantry-dra-plugin      what the DRA DaemonSet runs
#   gantry                 the CLI (gantry doctor, gantry cdi generate, ...)
#   gantry-runtime         the runc shim and hook, for installers that copy it to the host
#                          (static, no NVML: it runs the gantry beside it for NVML's answer,
#                          so copy both, or set runtime.gantry-path)
#   gantry-cdi-hook        the static hook the CDI specs of `gantry cdi generate` run
#
# The dynamic binaries use cgo (go-nvml loads libnvidia-ml.so.1 with dlopen), so the
# final stage needs glibc; the driver's libraries themselves come from the
# nvidia runtime when the pod starts. The builder is golang:*-bookworm so
# that the binaries ask for no newer glibc than the final stage's, Debian
# 12's. The final stage is distroless base-debian12 rather than
# debian:12-slim: glibc, CA certificates, /etc/passwd and tzdata, no shell
# and no package manager, so nothing in it runs but Gantry and there is
# less to patch; debug with `kubectl debug` or the gantry CLI itself.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ENV CGO_ENABLED=1 \
    CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
RUN set -e; for cmd in gantry gantry-device-plugin gantry-dra-plugin; do \
      go build -tags grpcnotrace -trimpath \
        -ldflags "-s -w -X github.com/gantry-gpu/gantry/internal/version.Version=${VERSION}" \
        -o /out/usr/bin/$cmd ./cmd/$cmd; \
    done; \
    go build -tags nonvml,gantrylean,osusergo,netgo -trimpath \
      -ldflags "-s -w -X github.com/gantry-gpu/gantry/internal/version.Version=${VERSION} -linkmode external -extldflags -static" \
      -o /out/usr/bin/gantry-runtime ./cmd/gantry-runtime; \
    CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/gantry-gpu/gantry/internal/version.Version=${VERSION}" \
      -o /out/usr/bin/gantry-cdi-hook ./cmd/gantry-cdi-hook

FROM gcr.io/distroless/base-debian12
ARG VERSION=dev
LABEL org.opencontainers.image.title="gantry" \
      org.opencontainers.image.description="Gantry: NVIDIA GPUs for containers and Kubernetes (device plugin, CLI, runtime)" \
      org.opencontainers.image.source="https://github.com/gantry-gpu/gantry" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/ /
# What NVIDIA's device plugin image sets: the nvidia runtime gives a
# container of this image every GPU and NVML, so that NVIDIA's static
# DaemonSets (no runtimeClassName, no env) run it with only the image
# swapped. Gantry's runtime honours the variable in an unprivileged pod only
# where the pod binds the kubelet's device-plugins directory (a kubelet
# plugin by construction; SECURITY.md). Pods of this image that need no GPU
# (the node installer) set NVIDIA_VISIBLE_DEVICES=void.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_DISABLE_REQUIRE=true
ENTRYPOINT ["/usr/bin/gantry-device-plugin"]
