#!/usr/bin/env bash
# Runs the apiserver outage tests (tests/e2e/outage.rs) with a long outage,
# for runs outside CI: tinylet as a cluster node on a private containerd,
# the fake apiserver refusing connections, then as a black hole, for
# SECONDS each (default 600), and a reboot with checkpoints in a black hole.
# Prints each test's figures (time to notice, to renew the lease, to report
# Ready again, to relist; requests in the first 10 s back). Needs root, like
# every e2e test.
#
#   bash packaging/outage.sh [SECONDS]
#
# SECONDS must exceed the node's lease duration (40 s). The run takes about
# 2 x SECONDS + 4 min once the test binary is built.
set -euo pipefail

die() { echo "outage.sh: $*" >&2; exit 1; }
say() { echo "outage.sh: $*" >&2; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs=${1:-600}
case "$secs" in
    '' | *[!0-9]*) die "SECONDS must be a whole number of seconds, not ${secs:?}" ;;
esac
[ "$secs" -gt 40 ] || die "an outage of ${secs} s does not outlast the node's 40 s lease"

if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/tinylet/target}
mkdir -p "$CARGO_TARGET_DIR"
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
export TINYLET_OUTAGE_SECS=$secs
log=$(mktemp)
trap 'rm -f "$log"' EXIT

say "running e2e::outage with TINYLET_OUTAGE_SECS=$secs"
start=$(date +%s)
status=0
# One test at a time: each starts its own containerd, and the outages' timing
# figures mean more on a quiet machine.
timeout --foreground $((secs * 3 + 1800))s \
    cargo test --test tests -- e2e::outage:: --test-threads 1 --nocapture 2>&1 | tee "$log" || status=$?
took=$(($(date +%s) - start))
say "figures:"
grep -E '^(outage figures|reboot in a black hole)' "$log" >&2 || true
[ "$status" = 0 ] || die "the outage tests failed (exit $status, ${took} s)"
grep -q '^test result: ok\. 3 passed' "$log" || die "expected the 3 outage tests to run"
say "the outage tests passed with ${secs} s outages in ${took} s"
