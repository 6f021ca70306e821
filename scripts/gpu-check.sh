#!/usr/bin/env bash
# On a host with NVIDIA GPUs: checks gantry's discovery against nvidia-smi and
# the generated CDI spec against the filesystem, then times `cdi generate`
# (bench/cdi-generate.sh: nvidia-ctk and gantry, beside NVIDIA's with NVIDIA_CTK).
#
#   scripts/gpu-check.sh [GANTRY_BINARY]      (default bin/gantry; run `make build` first)
#
# Environment: RUNS (timing runs, default 30), NVIDIA_CTK (path to an
# nvidia-ctk binary to time side by side, optional), DRIVER_ROOT (default /).
# Exit code 0 when every check passes.
set -uo pipefail
g=${1:-bin/gantry}
runs=${RUNS:-30}
root=${DRIVER_ROOT:-/}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
ok()   { echo "ok   $*"; }
bad()  { echo "FAIL $*"; fail=1; }

command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: this script needs a GPU host"; exit 2; }
echo "== host"
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,compute_cap,driver_version --format=csv,noheader
"$g" --version

echo "== gantry info --json vs nvidia-smi"
"$g" --driver-root "$root" info --json >"$work/info.json" || { bad "gantry info failed"; cat "$work/info.json"; exit 1; }
nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,compute_cap,driver_version --format=csv,noheader,nounits >"$work/smi.csv"
python3 - "$work/info.json" "$work/smi.csv" <<'PY' || fail=1
import json, sys
info = json.load(open(sys.argv[1]))
rows = [[c.strip() for c in l.split(",")] for l in open(sys.argv[2]) if l.strip()]
bad = 0
def check(what, got, want):
    global bad
    if str(got) != str(want):
        print(f"FAIL {what}: gantry {got!r}, nvidia-smi {want!r}"); bad = 1
check("GPU count", len(info["devices"]), len(rows))
for d, r in zip(info["devices"], rows):
    idx, uuid, name, bus, mem, cc, drv = r
    p = f"GPU {idx}"
    check(p + " index", d["index"], idx)
    check(p + " uuid", d["uuid"], uuid)
    check(p + " name", d["name"], name)
    check(p + " bus id", d["pciBusID"].lower(), bus.lower())
    check(p + " memory MiB", d["memoryMiB"], mem)
    check(p + " compute capability", d["computeCapability"], cc)
    check("driver version", info["driverVersion"], drv)
if not bad:
    print(f"ok   {len(rows)} GPUs: index, UUID, name, bus id, memory, compute capability and driver match nvidia-smi")
sys.exit(bad)
PY

echo "== gantry cdi generate: valid spec, files exist"
if "$g" --driver-root "$root" cdi generate --output "$work/cdi/nvidia.yaml" 2>"$work/gen.err"; then
  ok "$(cat "$work/gen.err")"
else
  bad "cdi generate: $(cat "$work/gen.err")"
fi
"$g" cdi list --spec-dirs "$work/cdi" >"$work/names" && ok "cdi list: $(tr '\n' ' ' <"$work/names")" || bad "cdi list"
"$g" --driver-root "$root" cdi generate --format json >"$work/spec.json" || bad "cdi generate --format json"
python3 - "$work/spec.json" <<'PY' || fail=1
import json, os, sys
spec = json.load(open(sys.argv[1]))
paths = []
def edits(e):
    for n in e.get("deviceNodes") or []:
        paths.append(n.get("hostPath") or n["path"])
    for m in e.get("mounts") or []:
        paths.append(m["hostPath"])
    for h in e.get("hooks") or []:
        paths.append(h["path"])
edits(spec.get("containerEdits") or {})
for d in spec["devices"]:
    edits(d["containerEdits"])
missing = [p for p in paths if not os.path.exists(p)]
for p in missing:
    print("FAIL missing:", p)
libs = [p for p in paths if "/lib" in p and ".so" in p]
print(f"ok   {len(paths)} paths in the spec ({len(libs)} libraries), {len(missing)} missing" if not missing else "", end="")
print()
for want in ("libcuda.so", "libnvidia-ml.so"):
    if not any(os.path.basename(p).startswith(want) for p in paths):
        print("FAIL spec lacks", want); sys.exit(1)
sys.exit(1 if missing else 0)
PY

echo "== timing: cdi generate ($runs rounds)"
RUNS=$runs DRIVER_ROOT=$root "$(dirname "$0")/../bench/cdi-generate.sh" "$g" || bad "benchmark"

[ $fail -eq 0 ] && echo "== all checks passed" || echo "== some checks FAILED"
exit $fail
