#!/usr/bin/env bash
# CRIU locks a checkpointed pod's network namespace with iptables-restore and
# ip6tables-restore (TestCheckpointGPUPod). For a GPU host that has no
# iptables and no network to install it, this carries the build machine's:
#   test/cluster/iptables-carry.sh pack [FILE]      on the build machine (Debian 12:
#                                                   apt-get install iptables), default bin/iptables.txz
#   sudo test/cluster/iptables-carry.sh install FILE on the GPU host
# pack takes xtables-nft-multi and xtables-legacy-multi with their libraries
# (glibc excepted: the host's must be as new, 2.36 for Debian 12) and every
# extension. install unpacks to /opt/gantry-iptables, tries the nft backend,
# then legacy, on CRIU's own lock rules in a fresh network namespace, and
# links iptables, ip6tables, iptables-restore and ip6tables-restore (and the
# -save ones) in /usr/local/sbin to a wrapper that runs the one that worked.
# It changes nothing where iptables-restore is already in PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=/opt/gantry-iptables
links="iptables ip6tables iptables-restore ip6tables-restore iptables-save ip6tables-save"
case "${1:-}" in
pack)
  out=${2:-bin/iptables.txz}
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  d=$tmp/gantry-iptables
  mkdir -p "$d/sbin" "$d/lib" "$d/xtables"
  for b in xtables-nft-multi xtables-legacy-multi; do
    p=$(command -v "$b") || { echo "iptables-carry.sh: $b not found (apt-get install iptables)" >&2; exit 1; }
    cp "$p" "$d/sbin/"
    ldd "$p" | awk '/=> \// {print $3}' | grep -v -e '/libc\.so' | xargs -r -I{} cp -L {} "$d/lib/"
  done
  ext=$(dirname "$(ldd "$(command -v xtables-nft-multi)" | awk '/libxtables/ {print $3}')")/xtables
  cp "$ext"/*.so "$d/xtables/"
  cat >"$d/wrap" <<'WRAP'
#!/bin/bash
# iptables carried by test/cluster/iptables-carry.sh: the program is the name it was run by.
d=/opt/gantry-iptables
LD_LIBRARY_PATH=$d/lib XTABLES_LIBDIR=$d/xtables exec -a "$(basename "$0")" "$d/sbin/xtables-$(cat $d/mode)-multi" "$@"
WRAP
  chmod 755 "$d/wrap"
  mkdir -p "$(dirname "$out")"
  tar -C "$tmp" -cJf "$out" gantry-iptables
  echo "iptables-carry.sh: $out ($(du -h "$out" | cut -f1))"
  ;;
install)
  [ -f "${2:-}" ] || { echo "usage: $0 install FILE (made by: $0 pack)" >&2; exit 2; }
  have() { local p; p=$(command -v "$1") && [ -x "$p" ]; }
  if have iptables-restore && have ip6tables-restore; then
    echo "iptables-carry.sh: iptables-restore is in PATH ($(command -v iptables-restore)): nothing to do"; exit 0
  fi
  rm -rf "$dir"; tar -C /opt -xJf "$2"
  rules=$(mktemp)
  printf '*filter\n:CRIU - [0:0]\n-I INPUT -j CRIU\n-I OUTPUT -j CRIU\n-A CRIU -m mark --mark 0xC114 -j ACCEPT\n-A CRIU -j DROP\nCOMMIT\n' >"$rules"
  for n in $links; do ln -sfn "$dir/wrap" "/usr/local/sbin/$n"; done
  for mode in nft legacy; do
    echo $mode >"$dir/mode"
    if unshare -n sh -c '/usr/local/sbin/iptables-restore -w <"$1" && /usr/local/sbin/ip6tables-restore -w <"$1"' sh "$rules"; then
      rm -f "$rules"; echo "iptables-carry.sh: CRIU's lock rules load with the $mode backend: /usr/local/sbin/iptables-restore and ip6tables-restore run it"; exit 0
    fi
  done
  rm -f "$rules"; for n in $links; do rm -f "/usr/local/sbin/$n"; done; rm -rf "$dir"
  echo "iptables-carry.sh: neither the nft nor the legacy backend loads CRIU's lock rules on this kernel: removed again" >&2
  exit 1
  ;;
*) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
