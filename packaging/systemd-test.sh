#!/usr/bin/env bash
# The README's two commands on a Debian machine whose init is systemd, as
# users have: a root made with `debootstrap --variant=minbase` plus systemd
# and dbus under /var/cache/tinylet/roots/<suite>-systemd (kept and
# reused), booted with systemd as its PID 1 by `systemd-nspawn -b`. A
# oneshot unit in it runs, once the system is up:
#   1 `bash packaging/test.sh` (deps.sh installs the packages with systemd
#     running: their services must stay stopped; deb-test.sh isolates the
#     package's install from the running systemd);
#   2 `bash packaging/demo.sh` until its clock pod runs, then Ctrl-C
#     (SIGINT to its process group);
#   3 the checks that neither changed the machine's services: the same
#     services running and the same unit files enabled as before step 1,
#     containerd.service and docker-registry.service not running,
#     docker-registry.service not enabled, no policy-rc.d left, nothing
#     listening on :5000;
# and then powers the container off. This script prints the unit's summary
# and exits with its result.
#
# nspawn's container protections that a real machine does not have are
# lifted in the unit before step 1, so that containers run as on a real
# machine: /sys, the cgroup controllers and /proc/sys are remounted
# read-write (nspawn mounts them read-only), and nspawn's own seccomp
# filter is off (SYSTEMD_SECCOMP=0). The network is the host's.
#
# The root has an installed Debian's package sources and trusts the
# certificate authorities this machine added (/usr/local/share/ca-certificates).
#
# The checkout is bind-mounted at its own path (and ../shared beside it),
# with the host's rustup toolchain (the README expects one). By default the
# build caches under /var/cache/tinylet (target dirs, fuzz corpus, test
# images) are the host's own, bind-mounted at the same paths, so a warm
# host makes a warm run (what this tests is the machine's init, not a cold
# build; CI builds cold on new machines); with --cold the root keeps caches
# of its own, and the run builds everything (gRPC's C core three times:
# about an hour on two cores).
#
#   bash packaging/systemd-test.sh [--cold] [--demo-only] [SUITE]
#                                           (root; SUITE bookworm)
#
# --demo-only leaves step 1 out (it says so): for a run after a change to
# the demo alone, when a whole run has passed on the tree before it.
#
# Needs root, deb.debian.org, and systemd-container and debootstrap
# (installed when missing). Not run by CI: it runs the whole suite again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
src=$(pwd)

cold=no
demo_only=no
while [ $# -gt 0 ]; do
    case $1 in
    --cold) cold=yes ;;
    --demo-only) demo_only=yes ;;
    *) break ;;
    esac
    shift
done
suite=${1:-bookworm}
say() { echo "systemd-test.sh: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, systemd-nspawn)"
root=${TINYLET_SYSTEMD_ROOT:-/var/cache/tinylet/roots/$suite-systemd}
results=$root.results
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
[ -x "$cargo_home/bin/cargo" ] || die "no rustup toolchain in $cargo_home (install it with rustup first)"

need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v systemd-nspawn >/dev/null || need+=(systemd-container)
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi
if [ ! -x "$root/lib/systemd/systemd" ]; then
    say "debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus $suite $root (a few minutes)"
    rm -rf "$root"
    mkdir -p "$root"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,ca-certificates \
        "$suite" "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
        die "debootstrap failed: $(tail -3 "$root.debootstrap.log")"
fi
# Each run boots a fresh copy of the pristine root: packages are installed
# anew, with systemd running, every time.
base=$root
root=$base.run
if pgrep -f "systemd-nspawn .*-D $root " >/dev/null; then
    die "a run is still booted on $root (its container must end first)"
fi
rm -rf "$root"
cp -a "$base" "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The package sources of a machine Debian's installer set up.
# shellcheck source=packaging/apt-install.sh
. packaging/apt-install.sh
debian_sources "$root" "$suite"
local_cas "$root"
rm -rf "$results"
mkdir -p "$results"

# The unit's script, run by systemd inside the booted root.
mkdir -p "$root/usr/local/sbin"
cat >"$root/usr/local/sbin/tinylet-readme-test" <<'EOF'
#!/bin/bash
# Written by tinylet's packaging/systemd-test.sh: the README's two commands
# under systemd as init, then the checks that they changed no service.
set -u
out=/results
# Everything it runs is traced here; the summary says what matters.
exec 3>&2 >$out/unit.log 2>&1
set -x
say() { echo "systemd-test.sh: $*" | tee -a $out/summary >&3; }
fail=0
bad() { say "FAIL: $*"; fail=1; }
src=$(cat /results/src)

# As on a real machine (nspawn mounts these read-only).
# The controllers are bind mounts of the host's hierarchies: only the
# mount's own flag changes (a remount of their superblock is refused).
mount -o remount,rw /sys
mount -o remount,rw /sys/fs/cgroup
for c in /sys/fs/cgroup/*; do
    if mountpoint -q "$c"; then mount -o remount,bind,rw "$c" || bad "cannot make $c writable"; fi
done
mount -o remount,bind,rw /proc/sys || bad "cannot make /proc/sys writable"

[ "$(cat /proc/1/comm)" = systemd ] || bad "PID 1 is $(cat /proc/1/comm), not systemd"
[ -d /run/systemd/system ] || bad "/run/systemd/system is missing: systemd is not the init"
say "init: $(cat /proc/1/comm) $(systemctl --version | head -n1 | cut -d' ' -f2), state $(systemctl is-system-running 2>&1)"
services() { systemctl list-units --type=service --state=running --no-legend --plain | awk '{print $1}' | grep -v '^tinylet-readme-test.service$' | sort; }
enabled() { systemctl list-unit-files --state=enabled --no-legend --plain | awk '{print $1}' | sort; }
services >$out/services.before
enabled >$out/enabled.before

# The machine's own certificate authorities (local_cas) in the bundle.
update-ca-certificates >/dev/null 2>&1 || bad "update-ca-certificates failed"

cd "$src"
start=$SECONDS
if [ -e $out/demo-only ]; then
    say "skipped: bash packaging/test.sh (--demo-only)"
    : >$out/test-sh.log
    rc=0
else
    bash packaging/test.sh >$out/test-sh.log 2>&1
    rc=$?
    say "bash packaging/test.sh exited $rc after $((SECONDS - start)) s"
fi
grep -E '^test result|^(deb-test|fuzz|release|qemu-e2e|real-apiserver|kubeadm-join|deps)(\.sh)?: (ok|skipped|SKIPPED|FAIL|isolated|installing|systemd|passed|dependencies)|[0-9]+ passed, [0-9]+ failed' \
    $out/test-sh.log | tail -40 | sed 's/^/    /' | tee -a $out/summary >&3
[ $rc = 0 ] || bad "bash packaging/test.sh (its log: $out/test-sh.log)"

start=$SECONDS
export TINYLET_DEMO_DIR=/tmp/systemd-test-demo
setsid bash packaging/demo.sh >$out/demo.log 2>&1 &
pid=$!
ok=no
# Its release build may be the first dynamic one in the target dir (the
# suite builds the static ones): up to 45 minutes, then 15 for the pod.
for _ in $(seq 2700); do
    grep -q "==> 3/5" $out/demo.log && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
done
for _ in $(seq 900); do
    if ctr --address $TINYLET_DEMO_DIR/containerd/containerd.sock -n k8s.io tasks ls 2>/dev/null | grep -q RUNNING &&
        grep -q 'container "clock" started' $out/demo.log; then ok=yes; break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 1
done
kill -INT -- -$pid 2>/dev/null
for _ in $(seq 60); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
left=$(pgrep -f "$TINYLET_DEMO_DIR" || true)
if [ $ok = yes ] && [ -z "$left" ]; then
    say "ok: bash packaging/demo.sh: the clock pod ran; Ctrl-C stopped tinylet and the private containerd ($((SECONDS - start)) s)"
else
    bad "bash packaging/demo.sh: pod ran: $ok; left running: ${left:-none}; $(tail -5 $out/demo.log | tr '\n' ' ')"
fi
rm -rf $TINYLET_DEMO_DIR

services >$out/services.after
enabled >$out/enabled.after
if cmp -s $out/services.before $out/services.after; then
    say "ok: the same $(wc -l <$out/services.after) services running as before: $(tr '\n' ' ' <$out/services.after)"
else
    bad "running services changed: $(diff $out/services.before $out/services.after | grep '^[<>]' | tr '\n' ' ')"
fi
if cmp -s $out/enabled.before $out/enabled.after; then
    say "ok: the same $(wc -l <$out/enabled.after) unit files enabled as before"
else
    bad "enabled unit files changed: $(diff $out/enabled.before $out/enabled.after | grep '^[<>]' | tr '\n' ' ')"
fi
for unit in containerd.service docker-registry.service; do
    state=$(systemctl is-active $unit 2>/dev/null)
    [ "$state" != active ] || bad "$unit is running"
done
installed=$(dpkg-query -W -f='${Status}\n' containerd docker-registry 2>/dev/null | grep -c 'install ok installed')
for unit in containerd.service docker-registry.service; do
    [ "$(systemctl is-enabled $unit 2>/dev/null)" != enabled ] || bad "$unit is enabled"
done
say "ok: containerd.service $(systemctl is-active containerd.service) and $(systemctl is-enabled containerd.service 2>&1), docker-registry.service $(systemctl is-active docker-registry.service) and $(systemctl is-enabled docker-registry.service 2>&1) (both installed by deps.sh: $installed of 2)"
[ ! -e /usr/sbin/policy-rc.d ] || bad "/usr/sbin/policy-rc.d was left behind"
if ss -Htln 'sport = :5000' | grep -q .; then bad "something listens on :5000: $(ss -Htlnp 'sport = :5000')"; fi
dpkg-query -W tinylet >/dev/null 2>&1 && bad "the tinylet package is installed on the machine"
[ ! -e /usr/bin/tinylet ] || bad "/usr/bin/tinylet is on the machine"

echo $fail >$out/rc
systemctl --no-block poweroff
EOF
chmod 0755 "$root/usr/local/sbin/tinylet-readme-test"

cat >"$root/etc/systemd/system/tinylet-readme-test.service" <<'EOF'
[Unit]
Description=tinylet: the README's two commands under systemd (packaging/systemd-test.sh)
After=multi-user.target
[Service]
Type=oneshot
Environment=HOME=/root PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
ExecStart=/usr/local/sbin/tinylet-readme-test
TimeoutStartSec=infinity
[Install]
WantedBy=multi-user.target
EOF
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sfn /etc/systemd/system/tinylet-readme-test.service \
    "$root/etc/systemd/system/multi-user.target.wants/tinylet-readme-test.service"
echo "$src" >"$results/src"
[ $demo_only = no ] || : >"$results/demo-only"

binds=(--bind="$src" --bind="$results:/results" --bind-ro="$rustup_home:/root/.rustup" --bind="$cargo_home:/root/.cargo")
if [ -d "$src/../shared" ]; then
    binds+=(--bind-ro="$(cd "$src/../shared" && pwd):$(dirname "$src")/shared")
fi
if [ $cold = no ]; then
    for d in target target-aarch64 target-fuzzing fuzz-corpus images; do
        mkdir -p "/var/cache/tinylet/$d"
        binds+=(--bind="/var/cache/tinylet/$d")
    done
fi

say "booting $root with systemd as PID 1 (systemd-nspawn -b); the unit runs bash packaging/test.sh, then bash packaging/demo.sh"
start=$SECONDS
rc=0
SYSTEMD_SECCOMP=0 timeout --foreground 150m systemd-nspawn -q -b -D "$root" --register=no --keep-unit \
    --capability=all --machine="tinylet-$suite" "${binds[@]}" >"$results/console.log" 2>&1 || rc=$?
[ -f "$results/summary" ] && cat "$results/summary" >&2
[ -f "$results/rc" ] || die "the container ended ($rc after $((SECONDS - start)) s) before the unit finished: $(tail -5 "$results/console.log" | tr '\n' ' ')"
[ "$(cat "$results/rc")" = 0 ] || die "under systemd in $suite (logs in $results)"
say "passed in Debian $suite with systemd as init, in $((SECONDS - start)) s"
