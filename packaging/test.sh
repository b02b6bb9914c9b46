#!/usr/bin/env bash
# Builds and runs every test of tinylet: unit tests, integration tests
# against the fake CRI server, and the end-to-end tests against a private
# real containerd (these need root). Exits non-zero when anything fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash packaging/deps.sh
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# The gRPC C core takes minutes to build: keep the target dir across runs.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/tinylet/target}
mkdir -p "$CARGO_TARGET_DIR"
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}

cargo --version
echo "test.sh: cargo test --all-targets --no-fail-fast (target dir $CARGO_TARGET_DIR)" >&2
# --no-fail-fast: one failing test binary does not hide the results of the
# others (the end-to-end tests run last); the exit status is still non-zero.
cargo test --all-targets --no-fail-fast
