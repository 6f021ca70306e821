#!/usr/bin/env bash
# Unpacks the archive test/cluster/build.sh --pack writes (bin/cluster.tar.xz)
# into bin/cluster on a host with no compiler, such as a GPU host, and takes
# gantry, gantry-runtime and gantry-cdi-hook out of the Gantry image in it
# (the archive leaves them out to stay small). Needs python3 or xz and tar.
#
#   test/cluster/unpack.sh [ARCHIVE]     (default bin/cluster.tar.xz)
set -euo pipefail
cd "$(dirname "$0")/../.."
archive=${1:-bin/cluster.tar.xz}
[ -f "$archive" ] || { echo "unpack.sh: $archive not found (test/cluster/build.sh --pack makes it)" >&2; exit 1; }
mkdir -p bin
if command -v xz >/dev/null; then
  xz -dc "$archive" | tar -C bin -xf -
else
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$archive" bin
fi
# The image is an OCI layout: index.json -> manifest -> its one layer.
python3 - bin/cluster/images/gantry.tar bin/cluster <<'PY'
import io, json, os, sys, tarfile
image, out = sys.argv[1], sys.argv[2]
with tarfile.open(image) as t:
    blob = lambda d: t.extractfile("blobs/sha256/" + d.split(":", 1)[1]).read()
    index = json.loads(t.extractfile("index.json").read())
    manifest = json.loads(blob(index["manifests"][0]["digest"]))
    layer = tarfile.open(fileobj=io.BytesIO(blob(manifest["layers"][-1]["digest"])))
    for name in ("gantry", "gantry-runtime", "gantry-cdi-hook"):
        data = layer.extractfile("usr/bin/" + name).read()
        path = os.path.join(out, name)
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.chmod(path + ".tmp", 0o755)
        os.replace(path + ".tmp", path)
PY
echo "unpacked into bin/cluster: now sudo test/cluster/up.sh"
