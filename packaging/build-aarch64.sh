#!/usr/bin/env bash
# Cross-builds tinylet for 64-bit ARM (aarch64-unknown-linux-gnu) on an
# x86_64 Debian bookworm machine: one static (crt-static), stripped release
# binary, gRPC's C++ core included. Checks that it is an aarch64 executable
# that needs no shared library, prints its size and runs `--version` and
# `--help` under qemu-aarch64-static. The binary's path is the last line of
# output.
#
#   bash packaging/build-aarch64.sh   # -> $CARGO_TARGET_DIR/aarch64-unknown-linux-gnu/release/tinylet
#
# How: rustup here has only the x86_64 standard library, but Debian's own
# Rust (rustc-web/cargo-web, 1.96 in bookworm-security) ships it for arm64 as
# a multiarch package, libstd-rust-web-dev:arm64. So this script adds the
# arm64 architecture to dpkg, installs that with the cross gcc/g++ and
# qemu-user-static, and builds with Debian's cargo and rustc called by full
# path (rustup's cargo stays first on PATH for everything else). The cc and
# cmake crates take the cross compilers from CC_/CXX_/AR_<target>; the cmake
# crate itself sets CMAKE_SYSTEM_NAME=Linux and CMAKE_SYSTEM_PROCESSOR=aarch64
# when the target is not the host, and CMake then finds the
# aarch64-linux-gnu- binutils beside the compilers. pkg-config only looks at
# arm64 .pc files, so no x86_64 library (libsystemd, say) can slip into the
# link.
#
# Packages are installed (as root) only when missing; `apt-get update` runs
# only then. Set TINYLET_AARCH64_NO_QEMU=1 to skip the qemu run.
#
# Time on the 2-core build machine (measured with other builds running):
# cold, packages missing and an empty target dir, 12.5 min (apt ~25 s, cargo
# 727 s, most of it gRPC's C++ core); warm, nothing changed, under 1 s; after
# a change in tinylet's own code 1 min 45 s (fat LTO). The binary: 8.14 MiB.
set -euo pipefail

die() { echo "build-aarch64.sh: $*" >&2; exit 1; }
say() { echo "build-aarch64.sh: $*" >&2; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Host packages the build itself needs (cmake, g++, make, pkg-config ...).
bash packaging/deps.sh

target=aarch64-unknown-linux-gnu
# The cross toolchain's name prefix, and Debian's name for the architecture.
triplet=aarch64-linux-gnu
arch=arm64

packages=(
    rustc-web cargo-web "libstd-rust-web-dev:$arch"
    "gcc-$triplet" "g++-$triplet" "binutils-$triplet"
    qemu-user-static file binutils
)

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
for p in "${packages[@]}"; do
    installed "$p" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing packages ${missing[*]}; run this script as root to install them"
    command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get: install them by hand"
    if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
        say "adding dpkg architecture $arch"
        dpkg --add-architecture "$arch"
    fi
    say "installing ${missing[*]}"
    # shellcheck source=packaging/apt-install.sh
    . "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh"
    apt_install build-aarch64.sh "${missing[@]}"
fi

cargo=/usr/bin/cargo
rustc=/usr/bin/rustc
if [ ! -x "$cargo" ] || [ ! -x "$rustc" ]; then
    die "Debian's $cargo or $rustc is missing (packages cargo-web, rustc-web)"
fi
[ -d "/usr/lib/rustlib/$target/lib" ] ||
    die "no standard library for $target in /usr/lib/rustlib (package libstd-rust-web-dev:$arch)"
# rustc-web and libstd-rust-web-dev must be the same build, or rustc refuses the rlibs.
host_ver=$(dpkg-query -W -f='${Version}' rustc-web)
std_ver=$(dpkg-query -W -f='${Version}' "libstd-rust-web-dev:$arch")
[ "$host_ver" = "$std_ver" ] ||
    die "rustc-web $host_ver and libstd-rust-web-dev:$arch $std_ver differ: install the same version of both"

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/tinylet/target-aarch64}
mkdir -p "$CARGO_TARGET_DIR"

export RUSTC=$rustc
# Target-only settings: build scripts and proc macros stay x86_64 with the
# host compilers.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=$triplet-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"
export CC_aarch64_unknown_linux_gnu=$triplet-gcc
export CXX_aarch64_unknown_linux_gnu=$triplet-g++
export AR_aarch64_unknown_linux_gnu=$triplet-ar
export PKG_CONFIG_ALLOW_CROSS=1
export PKG_CONFIG_LIBDIR=/usr/lib/$triplet/pkgconfig:/usr/share/pkgconfig
# grpcio-sys takes a plain CXX as CMake's C++ compiler for every target: a
# host value left in the environment would build gRPC for x86_64.
unset CXX CC AR CFLAGS CXXFLAGS
# The cmake crate runs `make -j$NUM_JOBS`; cargo sets it from --jobs.

# --offline when every crate is already in cargo's cache (CI's usual case),
# so the build needs no network; otherwise cargo fetches what is missing.
offline=()
if "$cargo" fetch --offline --target "$target" >/dev/null 2>&1; then
    offline=(--offline)
else
    say "some crates are not in cargo's cache yet: fetching them"
fi

say "$("$cargo" --version), $("$rustc" --version); target dir $CARGO_TARGET_DIR"
start=$(date +%s)
"$cargo" build "${offline[@]}" --locked --release --target "$target" --bin tinylet
say "cargo build took $(($(date +%s) - start)) s"

bin="$CARGO_TARGET_DIR/$target/release/tinylet"
[ -x "$bin" ] || die "$bin was not built"

# Checks: an aarch64 ELF, no shared library needed, stripped, under 10 MiB.
kind=$(file -b "$bin")
say "file: $kind"
case "$kind" in
    *"ARM aarch64"*) ;;
    *) die "$bin is not an aarch64 executable: $kind" ;;
esac
if readelf -d "$bin" | grep -q '(NEEDED)'; then
    readelf -d "$bin" | grep '(NEEDED)' >&2
    die "$bin still needs shared libraries"
fi
if readelf -S "$bin" | grep -q '\.symtab'; then
    die "$bin is not stripped (is strip = true in [profile.release]?)"
fi
size=$(stat -c %s "$bin")
limit=$((10 * 1024 * 1024))
awk -v b="$bin" -v s="$size" 'BEGIN { printf "build-aarch64.sh: %s: %d bytes (%.2f MiB), static, stripped\n", b, s, s / 1048576 }' >&2
[ "$size" -lt "$limit" ] || die "$bin is $size bytes, over the 10 MiB limit"

if [ "${TINYLET_AARCH64_NO_QEMU:-}" != 1 ]; then
    qemu=$(command -v qemu-aarch64-static) || die "qemu-aarch64-static not found (package qemu-user-static)"
    say "running $bin --version under $qemu"
    version=$("$qemu" "$bin" --version) || die "$bin --version failed under qemu"
    echo "$version" >&2
    [ -n "$version" ] || die "$bin --version printed nothing"
    help=$("$qemu" "$bin" --help) || die "$bin --help failed under qemu"
    grep -q -- '--pod-manifest-path' <<<"$help" || die "$bin --help does not list --pod-manifest-path"
    say "--help under qemu: $(wc -l <<<"$help") lines"
fi

echo "$bin"
