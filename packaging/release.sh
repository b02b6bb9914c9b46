#!/usr/bin/env bash
# Builds tinylet's release into dist/: the static x86_64 and aarch64
# binaries, their Debian packages and SHA256SUMS.
#
#   bash packaging/release.sh      # from a clean clone, as root, on Debian bookworm
#
# dist/ then holds
#   tinylet-<version>-x86_64-linux    static (crt-static), stripped
#   tinylet-<version>-aarch64-linux   the same, cross-built for 64-bit ARM
#   tinylet_<version>_amd64.deb       packaging/build-deb.sh around each binary
#   tinylet_<version>_arm64.deb
#   SHA256SUMS
# where <version> is Cargo.toml's. Each binary is checked: statically linked,
# for the right machine, under 10 MiB, and its --version names the commit
# (run under qemu-aarch64-static for the ARM one).
#
# What it needs is installed from Debian by deps.sh and build-aarch64.sh;
# the rustup toolchain must be there. The target dirs live outside the
# clone ($CARGO_TARGET_DIR, default /var/cache/tinylet/target, and
# $TINYLET_AARCH64_TARGET_DIR, default /var/cache/tinylet/target-aarch64,
# built with Debian's Rust), so a second run rebuilds only what
# changed: cold, both builds take ~20 minutes on 2 cores; warm, ~3. The
# two run at once (after a change to tinylet's code each spends minutes in
# a one-core fat-LTO link).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() { echo "release.sh: $*" >&2; exit 1; }
say() { echo "release.sh: $*" >&2; }

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
[ -n "$version" ] || die "no version in Cargo.toml"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/tinylet/target}
limit=$((10 * 1024 * 1024))

dist=dist
rm -rf "$dist"
mkdir -p "$dist"

# check BINARY MACHINE: static, for MACHINE (as readelf names it), < 10 MiB.
check() {
    local bin=$1 machine=$2 size
    readelf -h "$bin" | grep -q "Machine:.*$machine" || die "$bin is not for $machine"
    if readelf -d "$bin" 2>/dev/null | grep -q '(NEEDED)'; then
        die "$bin needs shared libraries"
    fi
    if readelf -l "$bin" | grep -q 'Requesting program interpreter'; then
        die "$bin asks for a dynamic loader"
    fi
    size=$(stat -c %s "$bin")
    [ "$size" -lt "$limit" ] || die "$bin is $size bytes, not under 10 MiB"
    say "$(basename "$bin"): $size bytes, static, $machine"
}

# The two builds run at once, the aarch64 one in the background (its
# output is shown when both are done): each ends in a fat-LTO link of
# tinylet that runs on one core for minutes, so together they take the
# time of the longer one. deps.sh runs first, so that only build-aarch64.sh
# may still call apt-get.
bash packaging/deps.sh
arm_out=$(mktemp)
arm_log=$(mktemp)
trap 'rm -f "$arm_out" "$arm_log"' EXIT
say "aarch64: packaging/build-aarch64.sh, in the background"
CARGO_TARGET_DIR=${TINYLET_AARCH64_TARGET_DIR:-/var/cache/tinylet/target-aarch64} \
    bash packaging/build-aarch64.sh >"$arm_out" 2>"$arm_log" &
arm_pid=$!

say "x86_64: packaging/build-static.sh"
x86_status=0
bash packaging/build-static.sh >&2 || x86_status=$?
arm_status=0
wait "$arm_pid" || arm_status=$?
say "aarch64: what packaging/build-aarch64.sh said:"
cat "$arm_log" >&2
[ "$x86_status" -eq 0 ] || die "packaging/build-static.sh failed (status $x86_status)"
[ "$arm_status" -eq 0 ] || die "packaging/build-aarch64.sh failed (status $arm_status)"

x86="$dist/tinylet-$version-x86_64-linux"
cp "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/tinylet" "$x86"
check "$x86" "X86-64"
"$x86" --version | grep -q " static)" || die "$x86 --version does not say static"

arm_built=$(tail -n1 "$arm_out")
[ -x "$arm_built" ] || die "build-aarch64.sh did not name a binary (got ${arm_built:-nothing})"
arm="$dist/tinylet-$version-aarch64-linux"
cp "$arm_built" "$arm"
check "$arm" "AArch64"
arm_version=$(qemu-aarch64-static "$arm" --version) || die "$arm --version under qemu failed"
grep -q "aarch64-unknown-linux-gnu, static)" <<<"$arm_version" ||
    die "$arm --version under qemu does not name its target: $arm_version"

bash packaging/build-deb.sh amd64 "$x86" "$version" "$dist" >/dev/null
bash packaging/build-deb.sh arm64 "$arm" "$version" "$dist" >/dev/null

(cd "$dist" && sha256sum -- tinylet-* tinylet_* > SHA256SUMS)
say "dist/:"
ls -l "$dist" >&2
