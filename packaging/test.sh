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
# A login shell or a service on a machine whose init is systemd has a soft
# limit of 1024 open files (the hard one is higher); the tests run servers
# with hundreds of clients and many agents at once, and fail with EMFILE
# under it. The soft limit goes up to the hard one, at most 65536.
nofile_hard=$(ulimit -Hn)
nofile=65536
if [ "$nofile_hard" != unlimited ] && [ "$nofile_hard" -lt "$nofile" ]; then nofile=$nofile_hard; fi
if [ "$(ulimit -Sn)" != unlimited ] && [ "$(ulimit -Sn)" -lt "$nofile" ]; then
    ulimit -Sn "$nofile" && echo "test.sh: open files limit raised to $nofile (soft)" >&2
fi

cargo --version
# Benches are left out: they are programs that measure, run by bench.sh.
# The timeout turns a hung test into a clear failure well inside CI's budget;
# --no-fail-fast keeps one failing test binary from hiding the others' results.
echo "test.sh: cargo test --lib --bins --tests (target dir $CARGO_TARGET_DIR)" >&2
timeout --foreground 45m cargo test --lib --bins --tests --no-run
# The aarch64 release build is the longest step on a new machine (its own
# gRPC C++ core, cross-compiled): it starts now, at the lowest priority,
# and takes the CPU the tests leave while they wait on containerd and
# timers. release.sh below builds it again and finds nothing left to do
# (or waits for cargo's lock until it is done); a failure here shows there.
arm_log=$(mktemp)
CARGO_TARGET_DIR=${TINYLET_AARCH64_TARGET_DIR:-/var/cache/tinylet/target-aarch64} \
    TINYLET_AARCH64_NO_QEMU=1 nice -n 19 bash packaging/build-aarch64.sh >"$arm_log" 2>&1 &
arm_pid=$!
trap 'kill "$arm_pid" 2>/dev/null || true; rm -f "$arm_log"' EXIT
timeout --foreground 45m cargo test --lib --bins --tests --no-fail-fast
# The benchmark is a program, not a test; make sure it still compiles.
# Built, not checked: a check compiles every dependency again as metadata
# (minutes on a fresh machine), a dev build reuses the tests' ones.
cargo build --benches --profile dev

# Coverage-guided fuzzing of the decoders of outside input, 30 s a target
# (the nightly build keeps its own target dir and builds the library
# without its `cri` feature: no gRPC C core). A crash fails the run;
# RELIABILITY.md has the longer runs' figures.
timeout --foreground 45m bash packaging/fuzz.sh 30

# The release: both static binaries, both .debs and SHA256SUMS in dist/
# (cold, the two builds take ~20 minutes; the target dirs are kept).
wait "$arm_pid" || echo "test.sh: the early aarch64 build failed; release.sh builds it again" >&2
timeout --foreground 40m bash packaging/release.sh
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
# The packages as Debian checks them, then the amd64 one installed, running
# a pod from /etc/kubernetes/manifests with its own config, and purged.
bash packaging/deb-lint.sh "dist/tinylet_${version}_amd64.deb" "dist/tinylet_${version}_arm64.deb"
timeout --foreground 5m bash packaging/deb-test.sh "dist/tinylet_${version}_amd64.deb"
# The aarch64 binary under qemu-aarch64-static against the private
# containerd: start, kill -9 and adoption, removal.
timeout --foreground 30m bash packaging/qemu-e2e.sh
# The x86_64 release binary natively, in that test and in the one that
# sets the most of a pod's security context (fsGroup's walk among it):
# the fat-LTO static link is the one build in which a libc function that
# Rust's std declares weak can be left at address 0 (statx was, and
# killed the node at the first fsGroup), and its identical functions are
# folded by the linker (build-static.sh). A filter that matched nothing
# would pass with 0 tests.
static_log=$(mktemp)
TINYLET_E2E_BIN="$PWD/dist/tinylet-${version}-x86_64-linux" timeout --foreground 10m \
    cargo test --test tests -- --exact e2e::basic::restarted_tinylet_adopts_running_pods \
    e2e::spec::security_context_and_tty_reach_the_process 2>&1 | tee "$static_log"
grep -q '^test result: ok\. 2 passed' "$static_log" ||
    { echo "test.sh: the static binary's end-to-end tests did not both run" >&2; exit 1; }
rm -f "$static_log"

# The tier against a real kube-apiserver, when one was built on this machine
# (../shared/tools/kube-control-plane); it says so and passes when absent.
TINYLET_BIN=$CARGO_TARGET_DIR/debug/tinylet timeout --foreground 10m bash packaging/real-apiserver.sh
# A real kubeadm join with tinylet as the kubelet (TLS bootstrap, serving
# certificate, rotation), against the same control plane; skipped likewise,
# and where /etc/kubernetes or /var/lib/kubelet exist.
TINYLET_BIN=$CARGO_TARGET_DIR/debug/tinylet timeout --foreground 10m bash packaging/kubeadm-join-test.sh
