#!/usr/bin/env bash
# The build and the tests in a root of another Debian release (default
# trixie, Debian 13: GCC 14, cmake 3.31), to show the README's commands work
# there: a root made with `debootstrap --variant=minbase` under
# /var/cache/tinylet/roots/<suite> (kept and reused) and entered in a mount
# namespace of its own as a mount point, this checkout and the
# host's rustup toolchain bind-mounted, a target dir of its own, and the
# packages packaging/deps.sh installs (as the README's commands do), an
# installed Debian's package sources and the certificate authorities this
# machine added (/usr/local/share/ca-certificates). In it:
#   1 a release build of tinylet with the root's g++ (grpcio-sys's C core)
#     and the binary's --version;
#   2 the unit tests;
#   3 the integration tests against the fake CRI and apiserver (all but
#     the end-to-end ones);
#   4 the end-to-end tests against a private containerd from the root's
#     packages, where the root allows it (otherwise it says why it skipped).
# With --full it runs instead, in the root, the README's two commands as a
# user would: `bash packaging/test.sh` (the whole suite: release builds,
# fuzzing, the packages and their install test) and `bash
# packaging/demo.sh`, until the demo's pod runs and then Ctrl-C (SIGINT to
# its process group).
# It takes long (a cold build of gRPC's C core; with --full, three), so CI
# does not run it.
#
#   bash packaging/distro-test.sh [--full | --demo-only] [SUITE]
# --demo-only runs the demo step of --full alone (after a change to the
# demo, when a --full run has passed on the tree before it).
# Needs root and deb.debian.org. Environment: TINYLET_DISTRO_ROOT,
# TINYLET_DISTRO_TARGET (default /var/cache/tinylet/target-<suite>).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
src=$(pwd)

full=${TINYLET_DISTRO_FULL:-no}
case ${1:-} in
--full) full=yes; shift ;;
--demo-only) full=demo; shift ;;
esac
suite=${1:-trixie}
say() { echo "distro-test.sh: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot, mounts)"
# Its mounts live in a mount namespace of its own, gone when it ends.
if [ -z "${TINYLET_DISTRO_NS:-}" ]; then
    exec env TINYLET_DISTRO_NS=1 TINYLET_DISTRO_FULL=$full unshare --mount --propagation private bash "$0" "$suite"
fi
root=${TINYLET_DISTRO_ROOT:-/var/cache/tinylet/roots/$suite}
target=${TINYLET_DISTRO_TARGET:-/var/cache/tinylet/target-$suite}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
[ -x "$cargo_home/bin/cargo" ] || die "no rustup toolchain in $cargo_home (install it with rustup first)"

if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
fi
if [ ! -x "$root/usr/bin/apt-get" ]; then
    say "debootstrap --variant=minbase $suite $root (a few minutes)"
    mkdir -p "$root"
    debootstrap --variant=minbase "$suite" "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
        die "debootstrap failed: $(tail -3 "$root.debootstrap.log")"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The package sources of a machine Debian's installer set up.
# shellcheck source=packaging/apt-install.sh
. packaging/apt-install.sh
debian_sources "$root" "$suite"
local_cas "$root"

# Mounts, undone in reverse order on the way out.
mounted=()
bind() { # SOURCE DEST [ro]
    mkdir -p "$root$2"
    mount --rbind "$1" "$root$2"
    mount --make-rslave "$root$2"
    mounted+=("$root$2")
    if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$root$2"; fi
}
cleanup() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -R -l "${mounted[i]}" 2>/dev/null || true
    done
}
trap cleanup EXIT
mkdir -p "$target"
# The root is a mount point, for pivot_root (below) and for runc, which
# remounts `/` as a slave before it pivots into a container's rootfs.
mount --bind "$root" "$root"
mounted+=("$root")
bind /proc /proc
bind /sys /sys
bind /dev /dev
bind "$src" /src
# The recorded apiserver traffic the tests replay, beside the checkout.
if [ -d "$src/../shared" ]; then bind "$(cd "$src/../shared" && pwd)" /shared ro; fi
bind "$rustup_home" /root/.rustup ro
bind "$cargo_home" /root/.cargo
bind "$target" /target
mkdir -p "$root/run" "$root/tmp"
mount -t tmpfs tmpfs "$root/run"
mounted+=("$root/run")

# Each step runs with the root as its mount namespace's root (pivot_root,
# not chroot): a process that joins a container's mount namespace (runc
# exec) lands at that namespace's root, which under a chroot would be the
# host's `/`, and mount paths read in /proc/self/mountinfo are the root's.
# The cargo home is the host's (its registry and git caches serve both),
# but what `cargo install` builds in the root (fuzz.sh's cargo-fuzz) links
# against the root's glibc and would not run on the host: it goes to a bin
# dir of the root's own, in its target dir, first on its PATH.
inside() {
    unshare --mount --propagation private sh -c '
        cd "$1" && mkdir -p .oldroot && pivot_root . .oldroot &&
        exec chroot . /usr/bin/env -i HOME=/root \
            PATH=/target/cargo-install/bin:/root/.cargo/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            RUSTUP_HOME=/root/.rustup CARGO_HOME=/root/.cargo CARGO_INSTALL_ROOT=/target/cargo-install \
            CARGO_TARGET_DIR=/target \
            TERM=dumb LANG=C.UTF-8 bash -c "umount -l /.oldroot && cd /src && $2"' sh "$root" "$1"
}

# The project's own dependency step, as the README's commands run it.
inside 'DEBIAN_FRONTEND=noninteractive apt-get update -q' >"$target/apt.log" 2>&1 ||
    die "apt-get update in the root: $(tail -3 "$target/apt.log")"
inside 'DEBIAN_FRONTEND=noninteractive bash packaging/deps.sh' >>"$target/apt.log" 2>&1 ||
    die "packaging/deps.sh in $suite: $(tail -5 "$target/apt.log")"
# deps.sh installed ca-certificates: the machine's own authorities
# (local_cas) go in its bundle.
inside 'update-ca-certificates' >>"$target/apt.log" 2>&1 ||
    die "update-ca-certificates in $suite: $(tail -5 "$target/apt.log")"

release=$(inside 'sed -n "s/^VERSION_ID=//p" /etc/os-release | tr -d \"') || true
gxx=$(inside 'g++ --version | head -n1')
say "root: Debian $suite ($release), $gxx, $(inside 'cmake --version | head -n1')"

if [ $full != no ]; then
    # The README's test command, whole.
    if [ $full = demo ]; then
        say "skipped: bash packaging/test.sh (--demo-only)"
    else
        start=$SECONDS
        rc=0
        inside 'bash packaging/test.sh' >"$target/test-sh.log" 2>&1 || rc=$?
        say "bash packaging/test.sh exited $rc after $((SECONDS - start)) s; its summary lines:"
        grep -E '^test result|: (ok|PASS|skipped|FAIL|FAILED)|passed' "$target/test-sh.log" | tail -40 >&2 || true
        [ $rc = 0 ] || die "bash packaging/test.sh in $suite (log: $target/test-sh.log)"
    fi
    # The README's demo command: its pod runs, then Ctrl-C.
    start=$SECONDS
    if inside 'export TINYLET_DEMO_DIR=/tmp/distro-demo
        setsid bash packaging/demo.sh >/target/demo.log 2>&1 &
        pid=$!
        ok=no
        # Its release build is the first in this target dir (test.sh built
        # only the static ones): up to 45 minutes cold, then 10 for the pod.
        for _ in $(seq 2700); do
            grep -q "==> 3/5" /target/demo.log && break
            kill -0 $pid 2>/dev/null || break
            sleep 1
        done
        for _ in $(seq 600); do
            if ctr --address $TINYLET_DEMO_DIR/containerd/containerd.sock -n k8s.io tasks ls 2>/dev/null | grep -q RUNNING &&
                grep -q "container \"clock\" started" /target/demo.log; then ok=yes; break; fi
            kill -0 $pid 2>/dev/null || break
            sleep 1
        done
        kill -INT -- -$pid 2>/dev/null
        for _ in $(seq 60); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
        # What still runs below the demo dir (tinylet, containerd, shims):
        # the trailing slash leaves out this very shell, whose command line
        # holds the dir in its export line.
        left=$(pgrep -af "$TINYLET_DEMO_DIR/" || true)
        rm -rf $TINYLET_DEMO_DIR
        [ -z "$left" ] || echo "left running: $left" >>/target/demo.log
        [ $ok = yes ] && [ -z "$left" ]'; then
        say "ok: bash packaging/demo.sh in $suite: the clock pod ran; Ctrl-C stopped tinylet and the private containerd ($((SECONDS - start)) s)"
    else
        die "bash packaging/demo.sh in $suite: $(tail -8 "$target/demo.log")"
    fi
    if [ $full = demo ]; then
        say "passed in Debian $suite ($release): the README's demo command"
    else
        say "passed in Debian $suite ($release): the README's two commands"
    fi
    exit 0
fi

# 1. The release build and its binary.
start=$SECONDS
inside 'cargo build --release --bin tinylet' >"$target/build.log" 2>&1 ||
    die "cargo build --release in $suite: $(tail -15 "$target/build.log")"
version=$(inside '/target/release/tinylet --version | head -n1') || die "the $suite build does not run"
say "ok: release build in $((SECONDS - start)) s with $gxx: $version"

# 2. Unit tests.
start=$SECONDS
inside 'cargo test --lib' >"$target/unit.log" 2>&1 || die "unit tests in $suite: $(grep -E '^test .*FAILED|panicked' "$target/unit.log" | head -10)"
say "ok: unit tests in $((SECONDS - start)) s: $(grep '^test result' "$target/unit.log" | tail -1)"

# 3. Integration tests against the fakes.
start=$SECONDS
inside 'cargo test --test tests -- --skip e2e' >"$target/fake.log" 2>&1 ||
    die "integration tests in $suite: $(grep -E '^test .*FAILED|panicked' "$target/fake.log" | head -10)"
say "ok: integration tests (fake CRI and apiserver) in $((SECONDS - start)) s: $(grep '^test result' "$target/fake.log" | tail -1)"

# 4. End-to-end tests on the root's containerd, if a private one starts.
probe=/tmp/distro-test-containerd
if inside "bash packaging/containerd-private.sh start $probe" >"$target/containerd.log" 2>&1; then
    inside "bash packaging/containerd-private.sh stop $probe" >/dev/null 2>&1 || true
    start=$SECONDS
    if inside 'cargo test --test tests -- e2e' >"$target/e2e.log" 2>&1; then
        say "ok: end-to-end tests on $suite's containerd in $((SECONDS - start)) s: $(grep '^test result' "$target/e2e.log" | tail -1)"
    else
        die "end-to-end tests in $suite: $(grep -E '^test .*FAILED|panicked' "$target/e2e.log" | head -10)"
    fi
else
    inside "bash packaging/containerd-private.sh stop $probe" >/dev/null 2>&1 || true
    say "skipped: end-to-end tests: a private containerd does not start in the $suite root: $(tail -3 "$target/containerd.log" | tr '\n' ' ')"
fi
say "passed in Debian $suite ($release)"
