#!/usr/bin/env bash
# Builds tinylet as one static, stripped binary for copying onto an
# appliance: glibc linked statically, gRPC's C core and the C++ runtime
# included. Prints its path and size.
#
# For size, under the 10 MiB line: the binary is not position-independent
# (`relocation-model=static`: no 0.35 MiB table of load-time relocations,
# and no pages dirtied by applying them), as Go builds the upstream kubelet
# on amd64; dependencies are optimized for size (`opt-level = "z"`),
# tinylet's own code for size and speed ("s"); and the linker folds
# functions whose machine code is identical (`--icf=all`: 0.17 MiB less).
# Only code is folded, never data (lld merges no data without
# --ignore-data-address-equality). Rust promises no distinct addresses for
# distinct functions; C++ code that compares function pointers for
# identity would be the one risk, so deb-test.sh runs a pod with this
# build and the end-to-end tests take it with TINYLET_E2E_BIN=<it>. The
# flag goes to the final link alone (`cargo rustc -- ...`), so it rebuilds
# none of the dependencies. Rust's x86_64 Linux toolchain links with its
# own lld (rust-lld, the default since 1.90); GNU ld would refuse the flag.
#
#   bash packaging/build-static.sh        # -> $CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/tinylet
#
# RUSTFLAGS differ from a normal build, so the first run rebuilds gRPC's C
# core (several minutes); later runs reuse the target dir.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash packaging/deps.sh
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/tinylet/target}
target=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
    cargo rustc --release --target "$target" --bin tinylet \
        --config 'profile.release.package."*".opt-level="z"' -- -C link-arg=-Wl,--icf=all
bin="$CARGO_TARGET_DIR/$target/release/tinylet"
# A static-pie has a dynamic section but needs no shared library.
if readelf -d "$bin" | grep -q '(NEEDED)'; then
    echo "build-static.sh: $bin still needs shared libraries:" >&2
    readelf -d "$bin" | grep '(NEEDED)' >&2
    exit 1
fi
size=$(stat -c %s "$bin")
awk -v b="$bin" -v s="$size" 'BEGIN { printf "build-static.sh: %s: %d bytes (%.1f MiB), statically linked\n", b, s, s / 1048576 }'
