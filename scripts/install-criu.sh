#!/usr/bin/env bash
# Installs a CRIU that runs on this kernel, for checkpoint and restore of
# containers (gantry-runtime checkpoint/restore, its tests, gpu-e2e check k).
#   scripts/install-criu.sh [PREFIX]   default PREFIX /opt/gantry-criu
# Prints the criu it found or installed, and its version.
#
# A criu of version 4 or later in PATH whose `criu check` passes is used as is.
# Otherwise (Debian 12 ships CRIU 3.17, which fails on kernels >= 6.x with a
# vDSO error) Debian 13's criu 4.x and the libraries it needs, its own glibc
# and loader included (it needs glibc 2.38), are downloaded with apt from a
# private source list (nothing of the host's apt configuration changes) and
# unpacked below PREFIX/root; PREFIX/bin/criu runs it through that loader,
# and /usr/local/sbin/criu links to it, where runc looks for "criu" (runc's
# --criu flag names another path).
# An already unpacked PREFIX is reused. Needs root, and the Debian mirror this
# host's apt already uses (its sources, or CRIU_MIRROR=URI).
set -euo pipefail
prefix=${1:-/opt/gantry-criu}
suite=trixie

works() { # criu binary: version >= 4 and criu check passes
  local v
  v=$("$1" --version 2>/dev/null | sed -n 's/^Version: *//p') || return 1
  [ -n "$v" ] && [ "${v%%.*}" -ge 4 ] 2>/dev/null || return 1
  "$1" check >/dev/null 2>&1 || return 1
  echo "$v"
}
say() { echo "install-criu: $*" >&2; }

if c=$(command -v criu) && v=$(works "$c"); then
  say "using $c (CRIU $v, criu check passes)"
  echo "$c"
  exit 0
fi
if [ -x "$prefix/bin/criu" ] && v=$(works "$prefix/bin/criu"); then
  ln -sfn "$prefix/bin/criu" /usr/local/sbin/criu
  say "using $prefix/bin/criu (CRIU $v from Debian $suite, criu check passes)"
  echo "$prefix/bin/criu"
  exit 0
fi
[ -n "${c:-}" ] && say "$c is not a working CRIU 4.x ($("$c" --version 2>&1 | tr '\n' ' ')): installing Debian $suite's"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/debs"
# The mirror this host's apt uses for Debian's main archive (deb822 or
# one-line sources), so the script names no host of its own.
mirror=${CRIU_MIRROR:-$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
  awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) {print $i; exit}}')}
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null)
[ -n "$mirror" ] || { say "no Debian mirror in this host's apt sources: set CRIU_MIRROR=URI of a Debian archive"; exit 1; }
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" >"$tmp/sources.list"
apt=(-o "Dir::Etc::sourcelist=$tmp/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$tmp/lists"
  -o "Dir::Cache=$tmp/cache" -o Dir::State::status=/dev/null -o APT::Sandbox::User=root -o APT::Architecture=amd64 -o APT::Architectures=amd64)
[ "$(uname -m)" = x86_64 ] || { say "only x86_64 is handled (this is $(uname -m)): build CRIU 4.x from source"; exit 1; }
apt-get "${apt[@]}" update -qq
# criu and every package it depends on, glibc included: they run together
# through that glibc's loader, never mixed with the host's libraries.
mapfile -t pkgs < <(apt-cache "${apt[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances criu | grep -v '^[ <]' | sort -u)
(cd "$tmp/debs" && apt-get "${apt[@]}" download -qq "${pkgs[@]}")
rm -rf "$prefix.new"
mkdir -p "$prefix.new/root" "$prefix.new/bin"
for d in "$tmp"/debs/*.deb; do dpkg-deb -x "$d" "$prefix.new/root"; done
r="$prefix/root"
libs="$r/usr/lib/x86_64-linux-gnu:$r/lib/x86_64-linux-gnu"
cat >"$prefix.new/bin/criu" <<EOF
#!/bin/sh
# Debian $suite's CRIU through its own loader and libraries (scripts/install-criu.sh).
# CRIU_FAULT=130 (FI_NO_BREAKPOINTS): the parasite's return is followed by
# syscall tracing, not a hardware breakpoint, which never fires in VMs without
# debug registers (Firecracker): the dump hangs there. It costs a few syscall
# stops per task.
export CRIU_FAULT=\${CRIU_FAULT:-130}
exec $r/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path $libs $r/usr/sbin/criu "\$@"
EOF
chmod 0755 "$prefix.new/bin/criu"
printf '%s\n' "${pkgs[@]}" >"$prefix.new/packages"
rm -rf "$prefix.old"
[ -e "$prefix" ] && mv "$prefix" "$prefix.old"
mv "$prefix.new" "$prefix"
rm -rf "$prefix.old"
if ! v=$(works "$prefix/bin/criu"); then
  say "$prefix/bin/criu does not work here:"
  "$prefix/bin/criu" check >&2 || true
  exit 1
fi
ln -sfn "$prefix/bin/criu" /usr/local/sbin/criu
say "installed CRIU $v (Debian $suite) in $prefix, linked from /usr/local/sbin/criu; criu check passes"
echo "$prefix/bin/criu"
