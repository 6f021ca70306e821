# oci_archive ROOT TAG OUT CONFIG [CREATED_BY]: writes OUT, a one-layer image
# archive of the directory ROOT named TAG (IMAGE:TAG), that both `docker load`
# (its manifest.json) and OCI tools (its index.json: `ctr images import`)
# read. CONFIG is the image config's "config" object as JSON (Env,
# Entrypoint, Cmd, Labels...). The archive is reproducible: sorted names,
# uid/gid 0, mtime 0. Sourced by scripts/build-image.sh and
# test/cluster/build.sh; needs tar, sha256sum and stat.
oci_archive() {
  local root=$1 tag=$2 out=$3 config=$4 created_by=${5:-gantry}
  local work arch
  work=$(mktemp -d "${TMPDIR:-/tmp}/oci-archive-XXXXXX")
  arch=$(uname -m)
  case "$arch" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; esac
  local blobs=$work/archive/blobs/sha256
  mkdir -p "$blobs"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$root" -cf "$work/layer.tar" $(cd "$root" && ls -A)
  _oci_blob() { # FILE MEDIATYPE: move FILE into blobs/, print its descriptor
    local sum size
    sum=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    mv "$1" "$blobs/$sum"
    printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$2" "$sum" "$size"
  }
  local layer_sum layer_desc config_sum config_desc manifest_desc
  layer_sum=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  layer_desc=$(_oci_blob "$work/layer.tar" application/vnd.oci.image.layer.v1.tar)
  printf '{"architecture":"%s","os":"linux","created":"1970-01-01T00:00:00Z","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"%s"}]}' \
    "$arch" "$config" "$layer_sum" "$created_by" >"$work/config.json"
  config_sum=$(sha256sum "$work/config.json" | cut -d' ' -f1)
  config_desc=$(_oci_blob "$work/config.json" application/vnd.oci.image.config.v1+json)
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
    "$config_desc" "$layer_desc" >"$work/manifest.json"
  manifest_desc=$(_oci_blob "$work/manifest.json" application/vnd.oci.image.manifest.v1+json)
  local a=$work/archive
  printf '{"imageLayoutVersion":"1.0.0"}' >"$a/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' \
    "${manifest_desc%\}},\"annotations\":{\"io.containerd.image.name\":\"$tag\",\"org.opencontainers.image.ref.name\":\"${tag##*:}\"}}" >"$a/index.json"
  printf '[{"Config":"blobs/sha256/%s","RepoTags":["%s"],"Layers":["blobs/sha256/%s"]}]' \
    "$config_sum" "$tag" "$layer_sum" >"$a/manifest.json"
  mkdir -p "$(dirname "$out")"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$a" -cf "$out.tmp" oci-layout index.json manifest.json blobs
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

# oci_copy_glibc ROOT: copies this machine's glibc runtime (what Debian's
# libc6 package and distroless/base hold) into the image tree ROOT, each at
# its path. ldd of a Go binary names only libc.so.6, but the libraries the
# NVIDIA runtime injects into the container (libnvidia-ml.so.1, libcuda.so.1)
# need libm, libpthread, libdl and librt as well: without them NVML cannot
# be loaded in the container.
oci_copy_glibc() {
  local root=$1 libc dir l
  libc=$(ldd /bin/sh | awk '$1 == "libc.so.6" {print $3}')
  [ -n "$libc" ] || { echo "oci_copy_glibc: libc.so.6 not found (ldd /bin/sh)" >&2; return 1; }
  dir=$(dirname "$libc")
  mkdir -p "$root$dir"
  for l in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 libutil.so.1 \
    libanl.so.1 libnss_files.so.2 libnss_dns.so.2 libmvec.so.1; do
    [ -e "$dir/$l" ] && cp -L "$dir/$l" "$root$dir/$l"
  done
  return 0
}
