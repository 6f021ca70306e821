#!/usr/bin/env bash
# Builds the Gantry container image (the one the Dockerfile builds, which the
# DaemonSet and the Helm chart run) without a registry, Docker or network:
# the binaries are built here and the image's root is them plus the shared
# libraries they link (as ldd lists them, the dynamic loader included), an
# ld.so.cache, CA certificates when this host has them, and a minimal /etc.
# The result is one tar that both `docker load` (its manifest.json) and OCI
# tools (its index.json: `ctr images import`) read.
#
#   scripts/build-image.sh [-o OUTPUT.tar] [-t IMAGE:TAG]
#   docker load -i bin/gantry-image.tar
#
# Defaults: -o bin/gantry-image.tar, -t ghcr.io/gantry-gpu/gantry:APPVERSION
# (the Helm chart's appVersion, the tag the manifests name). VERSION (default
# git describe, as the Makefile) is stamped into the binaries. Needs go, gcc,
# ldd, tar and sha256sum; ldconfig when present. The image's glibc is this
# host's: build on the oldest distribution the image must match (Debian 12
# for parity with the Dockerfile's distroless base-debian12).
set -euo pipefail
cd "$(dirname "$0")/.."

out=bin/gantry-image.tar
app=$(awk -F'"' '/^appVersion:/ {print $2}' deployments/helm/gantry/Chart.yaml)
tag="ghcr.io/gantry-gpu/gantry:${app:-dev}"
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=${2:?-o needs a file}; shift 2 ;;
    -t) tag=${2:?-t needs IMAGE:TAG}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (see scripts/build-image.sh --help)" >&2; exit 2 ;;
  esac
done
# IMAGE:TAG, the tag after the last colon and no slash in it (host:5000/img is
# an image without a tag); only the characters image references allow, so the
# JSON below needs no escaping.
if ! [[ $tag =~ ^[a-z0-9][a-z0-9._/:-]*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || [[ ${tag##*:} == */* ]]; then
  echo "build-image.sh: -t $tag: give IMAGE:TAG (e.g. ghcr.io/gantry-gpu/gantry:0.1.0)" >&2
  exit 2
fi
for tool in go gcc ldd tar sha256sum; do
  if ! command -v "$tool" >/dev/null && ! { [ "$tool" = go ] && [ -x /usr/local/go/bin/go ]; }; then
    echo "build-image.sh: $tool not found (make deps installs the build tools)" >&2
    exit 1
  fi
done
GO=$(command -v go || echo /usr/local/go/bin/go)
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
if ! [[ $VERSION =~ ^[A-Za-z0-9][A-Za-z0-9_.+-]*$ ]]; then
  echo "build-image.sh: VERSION=$VERSION: use letters, digits and . _ + - only (it goes into labels and -ldflags)" >&2
  exit 2
fi
arch=$("$GO" env GOARCH)

work=$(mktemp -d "${TMPDIR:-/tmp}/gantry-image-XXXXXX")
trap 'rm -rf "$work" "$out.tmp"' EXIT
root=$work/root

# A merged-/usr tree, as Debian 12 and distroless lay it out.
mkdir -p "$root"/usr/bin "$root"/usr/lib "$root"/usr/lib64 "$root"/usr/sbin "$root"/etc/ssl/certs "$root"/tmp "$root"/root
chmod 1777 "$root/tmp"
chmod 0700 "$root/root"
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$root/$d"; done

# The binaries, as the Dockerfile builds them (grpcnotrace: no gRPC request
# tracing pages, whose html/template costs the device plugin 3 MB).
export CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
for cmd in gantry gantry-device-plugin gantry-dra-plugin; do
  "$GO" build -tags grpcnotrace -trimpath \
    -ldflags "-s -w -X github.com/gantry-gpu/gantry/internal/version.Version=$VERSION" \
    -o "$root/usr/bin/$cmd" "./cmd/$cmd"
done
# gantry-runtime is static and has no NVML (it asks the gantry beside it),
# as make build builds it.
"$GO" build -tags nonvml,gantrylean,osusergo,netgo -trimpath \
  -ldflags "-s -w -X github.com/gantry-gpu/gantry/internal/version.Version=$VERSION -linkmode external -extldflags -static" \
  -o "$root/usr/bin/gantry-runtime" ./cmd/gantry-runtime
# The CDI hook is static (no cgo, no loader: its specs run it as root beside
# image content), so it adds no libraries below.
CGO_ENABLED=0 "$GO" build -trimpath \
  -ldflags "-s -w -X github.com/gantry-gpu/gantry/internal/version.Version=$VERSION" \
  -o "$root/usr/bin/gantry-cdi-hook" ./cmd/gantry-cdi-hook

# Their shared libraries, each at the path ldd names (through the tree's
# own bin/lib links, so a host without merged /usr still fills usr/).
libdirs=()
for cmd in gantry gantry-device-plugin gantry-dra-plugin; do
  while read -r lib; do
    [ -n "$lib" ] || continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
    libdirs+=("$(dirname "$lib")")
  done < <(ldd "$root/usr/bin/$cmd" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
done
# The whole glibc runtime, which the driver's libraries need (see oci_copy_glibc).
. scripts/lib/oci.sh
oci_copy_glibc "$root"
if [ ${#libdirs[@]} -eq 0 ]; then
  echo "build-image.sh: ldd found no libraries for the binaries: were they built without cgo?" >&2
  exit 1
fi
mkdir -p "$root/etc/ld.so.conf.d"
printf 'include /etc/ld.so.conf.d/*.conf\n' >"$root/etc/ld.so.conf"
printf '%s\n' "${libdirs[@]}" | sort -u | grep -v -x -e /lib64 -e /usr/lib64 >"$root/etc/ld.so.conf.d/gantry-image.conf" || true
ldconfig=$(command -v ldconfig || { [ -x /sbin/ldconfig ] && echo /sbin/ldconfig; } || true)
if [ -n "$ldconfig" ]; then
  "$ldconfig" -r "$root"
fi
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\nnonroot:x:65532:\n' >"$root/etc/group"
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"

# The layer: a reproducible tar (sorted, owned by root, time 0).
# The Env is the Dockerfile's: NVIDIA's device plugin image's NVIDIA_*
# variables (every GPU and NVML from the nvidia runtime), see there.
config='{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",'\
'"NVIDIA_VISIBLE_DEVICES=all","NVIDIA_DRIVER_CAPABILITIES=compute,utility","NVIDIA_DISABLE_REQUIRE=true"],'\
'"Entrypoint":["/usr/bin/gantry-device-plugin"],"WorkingDir":"/",'\
'"Labels":{"org.opencontainers.image.title":"gantry",'\
'"org.opencontainers.image.description":"Gantry: NVIDIA GPUs for containers and Kubernetes (device plugin, CLI, runtime)",'\
'"org.opencontainers.image.source":"https://github.com/gantry-gpu/gantry",'\
'"org.opencontainers.image.version":"'"$VERSION"'"}}'
oci_archive "$root" "$tag" "$out" "$config" scripts/build-image.sh
echo "built $tag ($VERSION, $arch, $(du -h "$out" | cut -f1)) in $out; load it with: docker load -i $out"
