#!/usr/bin/env bash
# Tests the aarch64 release binary for real: cross-builds it
# (build-aarch64.sh), then runs the end-to-end test
# e2e::basic::restarted_tinylet_adopts_running_pods with that binary under
# qemu-aarch64-static against a private x86_64 containerd (over its unix
# socket): a static pod starts, keeps its sandbox and container through a
# kill -9 of tinylet and a SIGTERM (the restarted tinylet adopts it, nothing
# restarted or doubled), a pod added while tinylet is down starts, and both
# are removed when their manifests go. Needs root, like every e2e test.
#
#   bash packaging/qemu-e2e.sh
#
# qemu-user runs the guest inside its own process, so the PID the test
# starts, sends SIGTERM and SIGKILL to is tinylet itself. The test's waits
# and no-change windows are stretched by TINYLET_E2E_TIME_SCALE (default 3
# here: under qemu the release binary starts in ~0.2 s and runs a pod in
# ~0.3 s, close to a native debug build, so 3 leaves a wide margin on a
# loaded machine). The run takes ~1 min once both binaries are built.
#
# Target dirs: the aarch64 build in TINYLET_AARCH64_TARGET_DIR (default
# /var/cache/tinylet/target-aarch64), the x86_64 test binary in
# CARGO_TARGET_DIR (default /var/cache/tinylet/target, as test.sh).
set -euo pipefail

die() { echo "qemu-e2e.sh: $*" >&2; exit 1; }
say() { echo "qemu-e2e.sh: $*" >&2; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."
test_name=e2e::basic::restarted_tinylet_adopts_running_pods

aarch64_dir=${TINYLET_AARCH64_TARGET_DIR:-/var/cache/tinylet/target-aarch64}
build_log=$(mktemp)
test_log=$(mktemp)
trap 'rm -f "$build_log" "$test_log"' EXIT

say "building the aarch64 binary (packaging/build-aarch64.sh, target dir $aarch64_dir)"
if ! CARGO_TARGET_DIR=$aarch64_dir bash packaging/build-aarch64.sh 2>&1 | tee "$build_log" >&2; then
    die "packaging/build-aarch64.sh failed"
fi
bin=$(tail -n 1 "$build_log")
[ -x "$bin" ] || die "build-aarch64.sh's last line is not an executable: $bin"
case "$(file -b "$bin")" in
    *"ARM aarch64"*) ;;
    *) die "$bin is not an aarch64 executable" ;;
esac
qemu=$(command -v qemu-aarch64-static) || die "qemu-aarch64-static not found (package qemu-user-static)"

if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/tinylet/target}
mkdir -p "$CARGO_TARGET_DIR"
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
export TINYLET_E2E_BIN=$bin
export TINYLET_E2E_WRAPPER=$qemu
export TINYLET_E2E_TIME_SCALE=${TINYLET_E2E_TIME_SCALE:-3}

say "running $test_name with TINYLET_E2E_WRAPPER=$qemu TINYLET_E2E_BIN=$bin TINYLET_E2E_TIME_SCALE=$TINYLET_E2E_TIME_SCALE"
start=$(date +%s)
status=0
timeout --foreground 20m cargo test --test tests -- --exact "$test_name" 2>&1 | tee "$test_log" || status=$?
took=$(($(date +%s) - start))
[ "$status" = 0 ] || die "$test_name failed under qemu (exit $status, ${took} s)"
# A filter that matched nothing would pass with 0 tests.
grep -q '^test result: ok\. 1 passed' "$test_log" ||
    die "$test_name did not run (cargo test ran no test, or more than one)"
say "$test_name passed with the aarch64 binary under qemu-aarch64-static in ${took} s (including building the x86_64 test binary)"
