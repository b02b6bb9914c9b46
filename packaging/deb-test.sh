#!/usr/bin/env bash
# Installs tinylet's amd64 Debian package on this machine, runs a pod with
# what it installed, purges it and checks that nothing is left.
#
#   deb-test.sh DEB      (as root)
#
# Needs what packaging/deps.sh installs (containerd, runc, CNI plugins,
# busybox-static) and systemd-analyze (the systemd package; installed when
# missing). Takes a few seconds.
#
# 1. `dpkg -i DEB`: the files are in place, the conffiles are registered,
#    /var/lib/tinylet is created with mode 0700, the unit is enabled (the
#    symlink) but nothing is started, and `systemd-analyze verify` accepts
#    the installed unit.
# 2. The installed /usr/bin/tinylet runs as the unit runs it (its ExecStart
#    with the installed /etc/tinylet/config.yaml, under the unit's
#    capability bounding set, no_new_privs and open files limit, starting
#    from systemd's soft limit of 1024) plus two flags only: the
#    endpoint of a private containerd (containerd-private.sh), and image GC
#    off (the test image can't be pulled, and GC would remove it on a disk
#    over 85% full). A pod
#    manifest dropped into /etc/kubernetes/manifests must start; its
#    container writes into a memory-backed emptyDir, which must be a tmpfs
#    tinylet mounted on the host, under /var/lib/tinylet, holding the file.
# 3. tinylet stops on SIGTERM and the container keeps running (what the
#    unit's KillMode=process relies on); then the pod's containers are
#    removed through containerd, leaving the tmpfs mounted for purge to meet.
# 4. `dpkg --purge tinylet`: no file of the package, no /etc/tinylet,
#    /var/lib/tinylet (nor a mount under it), no unit, enable or mask
#    symlink, and dpkg knows nothing of tinylet (dpkg -L, dpkg -S).
#
# It runs isolated from the machine's files and services: the script starts
# itself again in a private mount namespace (unshare) in which /etc, /usr
# and /var (and /bin, /lib, /sbin where they are not links into /usr) are
# overlays whose writable layer is a tmpfs, and /run/systemd is an empty
# tmpfs. dpkg installs into those layers, which vanish with the namespace;
# the maintainer scripts find no running systemd, so on a machine with
# systemd as init they neither start nor enable anything of the host's.
# Where that cannot be had (no unshare, no overlayfs, mounts refused) the
# test says "deb-test.sh: skipped: <reason>" and exits 0.
#
# Beyond those layers it cleans up, also on failure (trap): tinylet
# stopped, the private containerd and its network removed, the package
# purged (forcibly if its scripts fail), the pod's log directory and
# cgroups removed. It skips where the machine's own tinylet could meet the
# test's: tinylet installed here, any of its paths present, or a non-empty
# /etc/kubernetes/manifests.
# Exits non-zero with a line starting "deb-test.sh: FAIL:" on any failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
t_start=$SECONDS

say() { echo "deb-test.sh: $*" >&2; }
fail() {
    say "FAIL: $*"
    exit 1
}

[ $# = 1 ] || fail "usage: deb-test.sh DEB"
deb=$(realpath "$1")
[ -f "$deb" ] || fail "$1: no such file"
[ "$(id -u)" = 0 ] || fail "must run as root (dpkg -i, containerd, mounts)"
if ! command -v systemd-analyze >/dev/null; then
    # Only its parser is used; installing it does not make systemd the init.
    say "installing systemd (for systemd-analyze)"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends systemd >/dev/null; } ||
        fail "installing systemd failed"
fi
skip() {
    say "skipped: $*"
    exit 0
}

# ---- isolation: a private mount namespace with throwaway /etc, /usr, /var --
if [ "${TINYLET_DEB_TEST_ROOT:-}" = "" ]; then
    command -v unshare >/dev/null || skip "no unshare (util-linux) to isolate the install from this machine"
    grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || true
    grep -qw overlay /proc/filesystems || skip "the kernel has no overlayfs to isolate the install from this machine"
    layers=$(mktemp -d /tmp/tinylet-deb-root.XXXXXX)
    rc=0
    TINYLET_DEB_TEST_ROOT=$layers unshare --mount --propagation private \
        bash "${BASH_SOURCE[0]}" "$deb" || rc=$?
    rmdir "$layers" 2>/dev/null || rm -rf --one-file-system "$layers"
    exit $rc
fi
layers=$TINYLET_DEB_TEST_ROOT
mount -t tmpfs -o mode=0700 tinylet-deb-test "$layers" ||
    skip "mounting a tmpfs in a private mount namespace was refused"
# The script, the package and the helpers it runs, out of the way of the
# overlays (the clone may live under /var or /usr).
mkdir "$layers/packaging"
cp -a "$here/." "$layers/packaging/"
cp "$deb" "$layers/"
here=$layers/packaging
deb=$layers/$(basename "$deb")
# /etc/resolv.conf may link into /run/systemd (resolved), hidden below: the
# overlay gets a copy of its content.
resolv=""
[ -L /etc/resolv.conf ] && resolv=$(cat /etc/resolv.conf 2>/dev/null || true)
for d in /etc /usr /var /bin /lib /lib32 /lib64 /libx32 /sbin; do
    [ -d "$d" ] && [ ! -L "$d" ] || continue
    name=${d#/}
    mkdir -p "$layers/upper/$name" "$layers/work/$name"
    mount -t overlay "tinylet-deb-test-$name" \
        -o "lowerdir=$d,upperdir=$layers/upper/$name,workdir=$layers/work/$name" "$d" ||
        skip "an overlay on $d was refused (is $d itself on a filesystem overlayfs cannot take as its lower layer?)"
done
if [ -d /run/systemd ]; then
    mount -t tmpfs -o mode=0755 tinylet-deb-test-systemd /run/systemd ||
        skip "hiding /run/systemd from the package's scripts was refused"
fi
if [ -n "$resolv" ]; then
    rm -f /etc/resolv.conf
    printf '%s\n' "$resolv" >/etc/resolv.conf
fi
[ ! -d /run/systemd/system ] || fail "/run/systemd/system is still visible in the private namespace"
say "isolated: /etc, /usr, /var on throwaway overlays, /run/systemd hidden (private mount namespace)"

for tool in dpkg dpkg-deb dpkg-query ctr setpriv systemd-analyze; do
    command -v "$tool" >/dev/null || fail "$tool not found (run packaging/deps.sh)"
done

PKG=tinylet
MANIFESTS=/etc/kubernetes/manifests
STATE=/var/lib/tinylet
UNIT=/usr/lib/systemd/system/tinylet.service
KUBELET_UNIT=/usr/lib/systemd/system/kubelet.service
POD="deb-test"
# Everything the package installs or its scripts create.
PATHS=(
    /usr/bin/tinylet "$UNIT" /etc/tinylet /etc/default/tinylet "$STATE"
    /usr/share/doc/tinylet /usr/share/man/man8/tinylet.8.gz
    /usr/share/lintian/overrides/tinylet
    /etc/systemd/system/multi-user.target.wants/tinylet.service
    /etc/systemd/system/tinylet.service
    /var/lib/systemd/deb-systemd-helper-enabled/tinylet.service.dsh-also
    /var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/tinylet.service
    /var/lib/systemd/deb-systemd-helper-masked/tinylet.service
    /usr/bin/kubelet "$KUBELET_UNIT" /usr/share/man/man8/kubelet.8.gz
    /etc/systemd/system/multi-user.target.wants/kubelet.service
    /var/lib/systemd/deb-systemd-helper-enabled/kubelet.service.dsh-also
    /var/lib/systemd/deb-systemd-helper-masked/kubelet.service
)

# ---- refuse to run where it would disturb something ---------------------
[ "$(dpkg-deb -f "$deb" Package)" = "$PKG" ] || fail "$deb is not the $PKG package"
deb_arch=$(dpkg-deb -f "$deb" Architecture)
[ "$deb_arch" = "$(dpkg --print-architecture)" ] ||
    fail "$deb is for $deb_arch, this machine is $(dpkg --print-architecture)"
deb_version=$(dpkg-deb -f "$deb" Version)
if dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null | grep -qvx 'not-installed'; then
    skip "$PKG is installed here ($(dpkg-query -W -f='${db:Status-Abbrev} ${Version}' "$PKG")); the package test needs a machine without it"
fi
for p in "${PATHS[@]}"; do
    if [ -e "$p" ] || [ -L "$p" ]; then
        skip "$p exists; the package test needs a machine without $PKG's files"
    fi
done
if [ -d "$MANIFESTS" ] && [ -n "$(ls -A "$MANIFESTS")" ]; then
    skip "$MANIFESTS is not empty: the installed tinylet would run those pods too"
fi
had_kube_dir=no had_manifests=no had_pod_logs=no
[ -d /etc/kubernetes ] && had_kube_dir=yes
[ -d "$MANIFESTS" ] && had_manifests=yes
[ -d /var/log/pods ] && had_pod_logs=yes
# cgroup directories the pod's may create (v1 hierarchies, or v2).
kubepods_dirs=()
for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    for sub in "$d" "$d/besteffort"; do
        [ -d "$sub" ] || kubepods_dirs+=("$sub")
    done
done

work=$(mktemp -d /tmp/tinylet-deb-test.XXXXXX)
ctd="$work/containerd"
sock="$ctd/containerd.sock"
log="$work/tinylet.log"
started_containerd=no installed=no tinylet_pid="" manifest="" pod_uid=""

ctr_() { ctr --address "$sock" --timeout 10s -n k8s.io "$@"; }

# Mount points strictly below $1, deepest first.
mounts_below() {
    awk -v d="$1/" '{ m = $5; gsub(/\\040/, " ", m); if (index(m, d) == 1) print m }' \
        /proc/self/mountinfo | LC_ALL=C sort -r -u
}

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

cleanup() {
    local rc=$? p
    trap - EXIT INT TERM
    set +e
    if alive "$tinylet_pid"; then
        kill -TERM "$tinylet_pid"
        for _ in $(seq 50); do alive "$tinylet_pid" || break; sleep 0.1; done
        alive "$tinylet_pid" && kill -KILL "$tinylet_pid"
        wait "$tinylet_pid" 2>/dev/null
    fi
    # Any other tinylet on our socket (the one started above, should a
    # wrapper have stood between it and $!).
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = tinylet ] || continue
        tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qxF "unix://$sock" &&
            kill -KILL "${p#/proc/}" 2>/dev/null
    done
    [ -z "$manifest" ] || rm -f "$manifest"
    if [ $started_containerd = yes ]; then
        bash "$here/containerd-private.sh" stop "$ctd" >"$work/containerd-stop.log" 2>&1 ||
            { say "cleanup: stopping the private containerd failed:"; cat "$work/containerd-stop.log" >&2; rc=1; }
    fi
    if [ $installed = yes ] &&
        dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null | grep -qvx 'not-installed'; then
        say "cleanup: purging $PKG"
        if ! dpkg --purge "$PKG" >"$work/cleanup-purge.log" 2>&1; then
            cat "$work/cleanup-purge.log" >&2
            say "cleanup: dpkg --purge failed; purging without its maintainer scripts"
            rm -f /var/lib/dpkg/info/$PKG.prerm /var/lib/dpkg/info/$PKG.postrm
            dpkg --purge --force-remove-reinstreq "$PKG" >&2
        fi
        rc=1
    fi
    # None of these existed when the test started.
    if [ -d "$STATE" ]; then
        mounts_below "$STATE" | while IFS= read -r p; do umount "$p" || umount -l "$p"; done
        rm -rf --one-file-system "$STATE"
    fi
    for p in "${PATHS[@]}"; do
        { [ -e "$p" ] || [ -L "$p" ]; } && rm -rf --one-file-system "$p"
    done
    [ $had_manifests = no ] || mkdir -p "$MANIFESTS"
    [ $had_kube_dir = no ] || mkdir -p /etc/kubernetes
    if [ -n "$pod_uid" ]; then
        rm -rf /var/log/pods/default_"$POD"-*_"$pod_uid"
        for p in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
            for d in "$p/pod$pod_uid" "$p"/*/"pod$pod_uid"; do
                [ -d "$d" ] && rmdir "$d" 2>/dev/null
            done
        done
    fi
    [ $had_pod_logs = yes ] || rmdir /var/log/pods 2>/dev/null
    for ((i = ${#kubepods_dirs[@]} - 1; i >= 0; i--)); do
        [ -d "${kubepods_dirs[i]}" ] && rmdir "${kubepods_dirs[i]}" 2>/dev/null
    done
    rm -rf "$work"
    if [ $rc = 0 ]; then
        say "PASS in $((SECONDS - t_start)) s: installed, ran a pod from $MANIFESTS, purged clean"
    else
        say "failed after $((SECONDS - t_start)) s (machine restored)"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

tinylet_log() {
    say "tinylet's log (last 30 lines):"
    tail -n 30 "$log" >&2 || true
}

# ---- private containerd ---------------------------------------------------
started_containerd=yes
bash "$here/containerd-private.sh" start "$ctd" 2>"$work/containerd-start.log" ||
    { cat "$work/containerd-start.log" >&2; fail "the private containerd did not start"; }

# ---- 1. install -----------------------------------------------------------
say "dpkg -i $deb"
installed=yes
dpkg -i "$deb" >"$work/install.log" 2>&1 || { cat "$work/install.log" >&2; fail "dpkg -i $deb failed"; }
status=$(dpkg-query -W -f='${db:Status-Abbrev}${Version}' "$PKG")
[ "$status" = "ii $deb_version" ] || fail "after dpkg -i, dpkg says '$status', not 'ii $deb_version'"
[ -x /usr/bin/tinylet ] || fail "/usr/bin/tinylet is not installed as an executable"
version_line=$(/usr/bin/tinylet --version) || fail "/usr/bin/tinylet --version failed"
[[ "$version_line" == *" ${deb_version%%-*}"* ]] ||
    fail "/usr/bin/tinylet --version says '$version_line', not version ${deb_version%%-*}"
conffiles=$(dpkg-query -W -f='${Conffiles}' "$PKG")
for c in /etc/tinylet/config.yaml /etc/default/tinylet; do
    [ -f "$c" ] || fail "$c is not installed"
    grep -q "^ $c " <<<"$conffiles" || fail "$c is not registered as a conffile"
done
[ -f "$UNIT" ] || fail "$UNIT is not installed"
[ -d "$MANIFESTS" ] || fail "$MANIFESTS is not installed"
[ "$(stat -c '%a %U' "$STATE" 2>/dev/null)" = "700 root" ] ||
    fail "$STATE is not a directory of root with mode 0700 ($(stat -c '%a %U' "$STATE" 2>&1))"
if command -v deb-systemd-helper >/dev/null; then
    [ -L /etc/systemd/system/multi-user.target.wants/tinylet.service ] ||
        fail "postinst did not enable tinylet.service (no multi-user.target.wants symlink)"
fi
for p in /proc/[0-9]*; do
    [ "$(readlink "$p/exe" 2>/dev/null)" != /usr/bin/tinylet ] ||
        fail "postinst started /usr/bin/tinylet (pid ${p#/proc/}) although systemd is not running"
done
# It only warns about a bad directive: any output fails.
for u in "$UNIT" "$KUBELET_UNIT"; do
    if ! verify=$(systemd-analyze verify "$u" 2>&1) || [ -n "$verify" ]; then
        fail "systemd-analyze verify $u: ${verify:-non-zero exit}"
    fi
done
# tinylet as the kubelet, for kubeadm: the command its preflight runs prints
# the one line it parses, and the unit waits for `kubeadm join`.
[ "$(readlink /usr/bin/kubelet)" = tinylet ] || fail "/usr/bin/kubelet is not a link to tinylet"
kubelet_version=$(/usr/bin/kubelet --version) || fail "/usr/bin/kubelet --version failed"
[[ "$kubelet_version" =~ ^Kubernetes\ v[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
    fail "/usr/bin/kubelet --version says '$kubelet_version', not 'Kubernetes vX.Y.Z'"
[ ! -e /etc/systemd/system/multi-user.target.wants/kubelet.service ] ||
    fail "postinst enabled kubelet.service; only kubeadm join or the admin should"
say "installed $PKG $deb_version; unit enabled, nothing started; systemd-analyze verify accepts $UNIT and $KUBELET_UNIT; kubelet --version: $kubelet_version"

# ---- 2. run the installed tinylet as its unit does -------------------------
# The unit's command line, with $TINYLET_ARGS/$KUBELET_EXTRA_ARGS empty as
# /etc/default/tinylet ships them.
exec_start=$(sed -n 's/^ExecStart=//p' "$UNIT")
# shellcheck disable=SC2016 # the unit's text, variables unexpanded
[ "$exec_start" = '/usr/bin/tinylet --config /etc/tinylet/config.yaml $TINYLET_ARGS $KUBELET_EXTRA_ARGS' ] ||
    fail "unexpected ExecStart in $UNIT: $exec_start"
grep -q '^NoNewPrivileges=yes$' "$UNIT" || fail "$UNIT has no NoNewPrivileges=yes"
nofile=$(sed -n 's/^LimitNOFILE=//p' "$UNIT")
[ "$nofile" = 1048576 ] || fail "$UNIT has no LimitNOFILE=1048576 (found ${nofile:-none})"
grep -q '^TasksMax=[0-9]' "$UNIT" || fail "$UNIT has no TasksMax="
bounding=$(sed -n 's/^CapabilityBoundingSet=~//p' "$UNIT")
[ -n "$bounding" ] || fail "$UNIT has no CapabilityBoundingSet=~..."
drop=""
for cap in $bounding; do
    cap=${cap#CAP_}
    drop+="${drop:+,}-${cap,,}"
done

manifest="$MANIFESTS/$POD.yaml"
cat >"$manifest.tmp" <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $POD
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: scratch
    emptyDir: {medium: Memory}
  containers:
  - name: $POD
    image: docker.io/tinylet/busybox:1
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo from-the-container > /scratch/hello && exec sleep 3600"]
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
EOF
mv "$manifest.tmp" "$manifest"

say "running /usr/bin/tinylet --config /etc/tinylet/config.yaml --container-runtime-endpoint unix://$sock --image-gc-high-threshold 100 --eviction-hard 'memory.available<100Mi' (bounding set without ${bounding// /,}, no_new_privs)"
# Image GC off as well: on a machine whose disk is over 85% full it would
# remove the imported test image, which cannot be pulled; and the disk
# eviction thresholds, which would be met there too.
# The unit's hard limit, or this shell's when lower: raising a hard limit
# needs CAP_SYS_RESOURCE, which systemd has and a test's root may not.
hard=$nofile
cur_hard=$(ulimit -Hn)
if [ "$cur_hard" != unlimited ] && [ "$cur_hard" -lt "$nofile" ]; then
    hard=$cur_hard
    say "open files: this shell's hard limit $cur_hard is below the unit's $nofile; testing with $cur_hard"
fi
want_soft=$((hard < 1000000 ? hard : 1000000))
prlimit --nofile=1024:"$hard" setpriv --no-new-privs --bounding-set "$drop" \
    /usr/bin/tinylet --config /etc/tinylet/config.yaml \
    --container-runtime-endpoint "unix://$sock" --image-gc-high-threshold 100 \
    --eviction-hard 'memory.available<100Mi' >"$log" 2>&1 &
tinylet_pid=$!

filter="labels.\"io.kubernetes.container.name\"==$POD,labels.\"io.cri-containerd.kind\"==container"
cid=""
deadline=$((SECONDS + 60))
while :; do
    alive "$tinylet_pid" || { tinylet_log; fail "tinylet exited while the pod was starting"; }
    cid=$(ctr_ containers ls -q "$filter" 2>/dev/null | head -n 1) || cid=""
    if [ -n "$cid" ] && ctr_ tasks ls 2>/dev/null | awk -v id="$cid" '$1 == id && $3 == "RUNNING" {f = 1} END {exit !f}'; then
        break
    fi
    [ $SECONDS -lt $deadline ] || { tinylet_log; fail "the pod's container was not running within 60 s of tinylet's start"; }
    sleep 0.5
done
pod_uid=$(ctr_ containers info "$cid" | sed -n 's/.*"io.kubernetes.pod.uid": *"\([^"]*\)".*/\1/p' | head -n 1)
[ -n "$pod_uid" ] || fail "container $cid has no io.kubernetes.pod.uid label"
volume="$STATE/pods/$pod_uid/volumes/kubernetes.io~empty-dir/scratch"
deadline=$((SECONDS + 10))
until [ -f "$volume/hello" ]; do
    [ $SECONDS -lt $deadline ] || fail "$volume/hello, written by the container, is not there on the host"
    sleep 0.2
done
[ "$(cat "$volume/hello")" = from-the-container ] || fail "$volume/hello does not hold what the container wrote"
grep -qxF "$volume" <<<"$(mounts_below "$STATE")" || fail "$volume is not a mount point on the host"
[ "$(stat -f -c %T "$volume")" = tmpfs ] || fail "$volume is not a tmpfs"
# maxOpenFiles (1000000 in config.yaml) raised the soft limit from 1024,
# capped at the hard limit.
limits=$(awk '/^Max open files/ {print $4, $5}' "/proc/$tinylet_pid/limits")
[ "$limits" = "$want_soft $hard" ] || { tinylet_log; fail "tinylet's open files limit is \"$limits\", not $want_soft (soft) and $hard (hard)"; }
say "pod $POD running (container ${cid:0:12}, pod uid $pod_uid); its memory volume is a host tmpfs under $STATE"

# ---- 3. stop tinylet: the container stays ---------------------------------
kill -TERM "$tinylet_pid"
for _ in $(seq 150); do alive "$tinylet_pid" || break; sleep 0.1; done
alive "$tinylet_pid" && { tinylet_log; fail "tinylet did not exit within 15 s of SIGTERM"; }
rc=0
wait "$tinylet_pid" || rc=$?
tinylet_pid=""
[ $rc = 0 ] || { tinylet_log; fail "tinylet exited with status $rc on SIGTERM"; }
ctr_ tasks ls | awk -v id="$cid" '$1 == id && $3 == "RUNNING" {f = 1} END {exit !f}' ||
    fail "the pod's container did not outlive tinylet"
say "tinylet stopped on SIGTERM; the container kept running"
rm -f "$manifest"
manifest=""
# The pod's containers, then its sandbox.
ids=$(ctr_ containers ls -q "labels.\"io.kubernetes.pod.uid\"==$pod_uid,labels.\"io.cri-containerd.kind\"==container")
ids+=" $(ctr_ containers ls -q "labels.\"io.kubernetes.pod.uid\"==$pod_uid,labels.\"io.cri-containerd.kind\"==sandbox")"
for id in $ids; do
    ctr_ tasks rm -f "$id" >/dev/null 2>&1 || true
    ctr_ containers rm "$id" >/dev/null || fail "ctr containers rm $id failed"
done
left=$(ctr_ containers ls -q "labels.\"io.kubernetes.pod.uid\"==$pod_uid")
[ -z "$left" ] || fail "containers of the pod left in containerd: $left"
grep -qxF "$volume" <<<"$(mounts_below "$STATE")" || fail "$volume is no longer mounted: purge would not meet a mount"

# ---- 4. purge ---------------------------------------------------------------
say "dpkg --purge $PKG (with $volume still mounted)"
dpkg --purge "$PKG" >"$work/purge.log" 2>&1 || { cat "$work/purge.log" >&2; fail "dpkg --purge $PKG failed"; }
left=()
for p in "${PATHS[@]}"; do
    if [ -e "$p" ] || [ -L "$p" ]; then left+=("$p"); fi
done
[ $had_manifests = yes ] || [ ! -e "$MANIFESTS" ] || left+=("$MANIFESTS")
[ $had_kube_dir = yes ] || [ ! -e /etc/kubernetes ] || left+=(/etc/kubernetes)
compgen -G "/var/lib/dpkg/info/$PKG.*" >/dev/null && left+=("/var/lib/dpkg/info/$PKG".*)
[ ${#left[@]} = 0 ] || fail "left after dpkg --purge: ${left[*]}"
below=$(mounts_below "$STATE")
[ -z "$below" ] || fail "still mounted under $STATE after purge: $below"
if dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null | grep -qvx 'not-installed'; then
    fail "dpkg still knows $PKG: $(dpkg-query -W -f='${db:Status-Abbrev}' "$PKG")"
fi
if out=$(dpkg -L "$PKG" 2>/dev/null) && [ -n "$out" ]; then
    fail "dpkg -L $PKG still lists files: $out"
fi
if out=$(dpkg -S /usr/bin/tinylet "$UNIT" /etc/tinylet/config.yaml 2>/dev/null); then
    fail "dpkg -S still finds: $out"
fi
installed=no
say "purged: no file, directory, mount, symlink or dpkg record of $PKG left"
