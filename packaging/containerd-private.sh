#!/usr/bin/env bash
# Runs a private containerd (CRI enabled) whose every file lives under one
# directory, so that tests, the demo and CI can each have their own, several
# at once, beside (or without) the machine's own containerd.
#
#   containerd-private.sh start DIR   write DIR/config.toml and a CNI conflist,
#                                     start containerd in the background, wait
#                                     until it answers, import the test images
#   containerd-private.sh stop DIR    kill its tasks, stop it, unmount whatever
#                                     is left under DIR, remove its bridge,
#                                     iptables rules and subnet claim
#
# After `start`, DIR holds:
#   containerd.sock   the gRPC (CRI) socket: unix://DIR/containerd.sock
#   containerd.log    containerd's log
#   containerd.pid    its process id
#   cni/              the CNI conflist (bridge + host-local + portmap + loopback)
#   cni-ipam/         host-local IPAM leases, one file per pod IP
#   cni-index         N: the instance uses bridge tinylet<N>, subnet 10.199.N.0/24
#   snapshotter       overlayfs, or native where DIR's filesystem lacks overlay
#   root/ state/ runc/ containerd's root, state and runc's state
# DIR itself is left in place by `stop` (the log stays readable); remove it
# afterwards.
#
# Images (built by oci-image.sh, cached in $TINYLET_IMAGE_CACHE, default
# /var/cache/tinylet/images): docker.io/tinylet/busybox:1 and
# docker.io/tinylet/pause:1 (the sandbox image), both in namespace k8s.io.
#
# Environment: CONTAINERD_LOG_LEVEL (default info), TINYLET_IMAGE_CACHE.
# Needs root, containerd, ctr, runc, /usr/lib/cni plugins, iproute2, iptables,
# flock; packaging/deps.sh installs them.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmd=${1:-}
dir_arg=${2:-}

die() { echo "containerd-private.sh: $*" >&2; exit 1; }
say() { echo "containerd-private.sh: $*" >&2; }

[ -n "$cmd" ] && [ -n "$dir_arg" ] || die "usage: containerd-private.sh start|stop DIR"

CNI_BIN_DIR=/usr/lib/cni
CLAIMS=/run/tinylet-cni
SUBNET_PREFIX=10.199

# True while process $1 exists and is not a zombie (orphans here may be
# reaped late, so /proc/PID alone is not enough).
alive() {
    local state
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# True when process $1 is a live containerd.
containerd_alive() {
    alive "$1" && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = containerd ]
}

need() {
    local missing=()
    [ "$(id -u)" = 0 ] || die "must run as root (containerd, mounts, network namespaces)"
    for tool in containerd ctr runc containerd-shim-runc-v2 ip iptables iptables-save flock setsid; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    for plugin in bridge host-local portmap loopback; do
        [ -x "$CNI_BIN_DIR/$plugin" ] || missing+=("$CNI_BIN_DIR/$plugin")
    done
    [ ${#missing[@]} = 0 ] || die "missing: ${missing[*]} (run packaging/deps.sh: apt packages containerd runc containernetworking-plugins iproute2 iptables util-linux)"
}

# ---- subnet claims: one /24 and bridge per running instance ---------------
# A claim is $CLAIMS/N holding the owning DIR; it is stale when that DIR no
# longer names N as its index or its containerd is gone.
claim_is_stale() {
    local n=$1 owner
    owner=$(cat "$CLAIMS/$n" 2>/dev/null) || return 0
    [ "$(cat "$owner/cni-index" 2>/dev/null)" = "$n" ] || return 0
    local pid
    pid=$(cat "$owner/containerd.pid" 2>/dev/null) || return 0
    containerd_alive "$pid" || return 0
    return 1
}

claim_subnet() {
    local dir=$1
    mkdir -p "$CLAIMS"
    exec 9>"$CLAIMS/.lock"
    flock 9
    local n start i
    # Start the search at a place derived from DIR to keep instances apart.
    start=$(($(printf '%s' "$dir" | cksum | cut -d' ' -f1) % 250))
    for ((i = 0; i < 250; i++)); do
        n=$(((start + i) % 250 + 1))
        if [ -e "$CLAIMS/$n" ] && ! claim_is_stale "$n"; then
            continue
        fi
        # Also skip subnets or bridge names somebody else uses on this host.
        if ip -o -4 addr show | grep -qF " $SUBNET_PREFIX.$n."; then
            continue
        fi
        if ip link show "tinylet$n" >/dev/null 2>&1; then
            continue
        fi
        printf '%s\n' "$dir" >"$CLAIMS/$n"
        printf '%s\n' "$n" >"$dir/cni-index"
        flock -u 9
        exec 9>&-
        return 0
    done
    flock -u 9
    exec 9>&-
    die "no free $SUBNET_PREFIX.N.0/24 subnet (claims in $CLAIMS)"
}

release_subnet() {
    local dir=$1 n
    n=$(cat "$dir/cni-index" 2>/dev/null) || return 0
    if [ "$(cat "$CLAIMS/$n" 2>/dev/null)" = "$dir" ]; then
        rm -f "$CLAIMS/$n"
    fi
}

# ---- start ------------------------------------------------------------------
pick_snapshotter() {
    local dir=$1 t
    t=$(mktemp -d "$dir/.overlay-probe.XXXXXX")
    mkdir -p "$t/lower" "$t/upper" "$t/work" "$t/merged"
    if mount -t overlay overlay -o "lowerdir=$t/lower,upperdir=$t/upper,workdir=$t/work" "$t/merged" 2>/dev/null; then
        umount "$t/merged"
        rm -rf "$t"
        echo overlayfs
    else
        rm -rf "$t"
        echo native
    fi
}

write_config() {
    local dir=$1 snapshotter=$2 n=$3
    local unused_snapshotter=io.containerd.snapshotter.v1.native
    [ "$snapshotter" = native ] && unused_snapshotter=io.containerd.snapshotter.v1.overlayfs
    cat >"$dir/config.toml.tmp" <<EOF
# Private containerd written by packaging/containerd-private.sh.
version = 2
root = "$dir/root"
state = "$dir/state"
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "$unused_snapshotter",
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "$dir/containerd.sock"

[ttrpc]
  address = "$dir/containerd.sock.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"

[plugins."io.containerd.grpc.v1.cri"]
  # Root here may lack CAP_SYS_RESOURCE: without this, sandboxes asking for
  # oom_score_adj -998 fail to start.
  restrict_oom_score_adj = true
  sandbox_image = "docker.io/tinylet/pause:1"
  # Keep pod network namespaces under DIR so that stop can find them.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$snapshotter"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$dir/runc"
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$dir/cni"
    max_conf_num = 1
EOF
    mv "$dir/config.toml.tmp" "$dir/config.toml"

    mkdir -p "$dir/cni" "$dir/cni-ipam"
    rm -f "$dir"/cni/*.conflist
    cat >"$dir/cni/10-tinylet.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "tinylet-$n",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "tinylet$n",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni-ipam",
        "ranges": [[{ "subnet": "$SUBNET_PREFIX.$n.0/24" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } },
    { "type": "loopback" }
  ]
}
EOF
}

import_images() {
    local dir=$1 snapshotter=$2
    local cache=${TINYLET_IMAGE_CACHE:-/var/cache/tinylet/images}
    local images
    images=$(bash "$here/oci-image.sh" "$cache")
    local img
    for img in $images; do
        ctr --address "$dir/containerd.sock" -n k8s.io images import \
            --snapshotter "$snapshotter" "$img" >/dev/null ||
            die "importing $img into $dir failed"
    done
}

start() {
    local dir=$1
    need
    mkdir -p "$dir"
    dir=$(realpath "$dir")
    # Unix socket paths are limited to 108 bytes; shim paths add more.
    [ ${#dir} -le 80 ] || die "DIR path too long for a unix socket: $dir"
    if pid=$(cat "$dir/containerd.pid" 2>/dev/null) && containerd_alive "$pid"; then
        die "a containerd ($pid) is already running for $dir; stop it first"
    fi

    local t0 t1 t2
    t0=$(date +%s%N)
    claim_subnet "$dir"
    local n snapshotter
    n=$(cat "$dir/cni-index")
    snapshotter=$(pick_snapshotter "$dir")
    write_config "$dir" "$snapshotter" "$n"
    printf '%s\n' "$snapshotter" >"$dir/snapshotter"
    mkdir -p "$dir/root" "$dir/state" "$dir/runc" "$dir/opt"
    rm -f "$dir/containerd.sock" "$dir/containerd.sock.ttrpc"

    # A session of its own: a Ctrl-C meant for the caller does not reach
    # containerd, whose tasks `stop` still has to clean up.
    setsid containerd --config "$dir/config.toml" \
        --log-level "${CONTAINERD_LOG_LEVEL:-info}" \
        </dev/null >>"$dir/containerd.log" 2>&1 &
    local pid=$!
    printf '%s\n' "$pid" >"$dir/containerd.pid"

    local deadline=$((SECONDS + 30))
    until ctr --address "$dir/containerd.sock" --timeout 1s version >/dev/null 2>&1; do
        if ! alive "$pid"; then
            tail -n 30 "$dir/containerd.log" >&2 || true
            release_subnet "$dir"
            die "containerd exited during start-up; log: $dir/containerd.log"
        fi
        if [ $SECONDS -ge $deadline ]; then
            tail -n 30 "$dir/containerd.log" >&2 || true
            die "containerd did not answer on $dir/containerd.sock within 30 s; log: $dir/containerd.log"
        fi
        sleep 0.05
    done
    t1=$(date +%s%N)
    import_images "$dir" "$snapshotter"
    t2=$(date +%s%N)
    say "containerd $pid on unix://$dir/containerd.sock (snapshotter $snapshotter, bridge tinylet$n, $SUBNET_PREFIX.$n.0/24): up in $(((t1 - t0) / 1000000)) ms, images imported in $(((t2 - t1) / 1000000)) ms"
}

# ---- stop -------------------------------------------------------------------
# Pids of shims started by the containerd at socket $1 (matched on the
# -address argument of their command line, never by name alone).
shim_pids() {
    local sock=$1 p
    for p in /proc/[0-9]*; do
        [ -r "$p/cmdline" ] || continue
        if tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qxF -- "$sock"; then
            case "$(cat "$p/comm" 2>/dev/null)" in
            containerd-shim*) echo "${p#/proc/}" ;;
            esac
        fi
    done
}

# Mount points at or below $1, deepest first.
mounts_under() {
    local dir=$1
    awk -v d="$dir" '{
        m = $5
        gsub(/\\040/, " ", m)
        if (m == d || index(m, d "/") == 1) print length(m) "\t" m
    }' /proc/self/mountinfo | sort -rn | cut -f2-
}

remove_iptables_rules() {
    local name=$1 table=nat chain line target
    local -a targets=()
    command -v iptables >/dev/null || return 0
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" || $1 == "-P" {print $2}'); do
        while IFS= read -r line; do
            [ -n "$line" ] || continue
            target=$(sed -n 's/.* -j \([^ ]*\).*/\1/p' <<<"$line")
            # `iptables -S` quotes like a shell does: replay the rule as -D.
            eval "iptables -t $table -D ${line#-A }" 2>/dev/null || true
            case "$target" in
            CNI-HOSTPORT-*) ;;
            CNI-*) targets+=("$target") ;;
            esac
        done < <(iptables -t "$table" -S "$chain" 2>/dev/null | grep -F "name: \\\"$name\\\"" || true)
    done
    for target in "${targets[@]}"; do
        iptables -t "$table" -F "$target" 2>/dev/null || true
        iptables -t "$table" -X "$target" 2>/dev/null || true
    done
}

stop() {
    local dir=$1
    [ -d "$dir" ] || { say "$dir does not exist; nothing to stop"; return 0; }
    dir=$(realpath "$dir")
    local sock="$dir/containerd.sock"
    local pid=""
    if p=$(cat "$dir/containerd.pid" 2>/dev/null) && containerd_alive "$p"; then
        pid=$p
    fi

    # 1. Tasks, while containerd is still there to clean up after them:
    #    application containers first, then the sandboxes.
    if [ -n "$pid" ]; then
        local ns id
        for ns in $(ctr --address "$sock" --timeout 5s namespaces ls -q 2>/dev/null); do
            local sandboxes
            sandboxes=$(ctr --address "$sock" --timeout 5s -n "$ns" containers ls -q \
                'labels."io.cri-containerd.kind"==sandbox' 2>/dev/null || true)
            for pass in containers sandboxes; do
                for id in $(ctr --address "$sock" --timeout 5s -n "$ns" tasks ls -q 2>/dev/null); do
                    if grep -qxF -- "$id" <<<"$sandboxes"; then
                        [ $pass = sandboxes ] || continue
                    else
                        [ $pass = containers ] || continue
                    fi
                    ctr --address "$sock" --timeout 10s -n "$ns" tasks rm -f "$id" >/dev/null 2>&1 || true
                done
            done
        done
        kill -TERM "$pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 200; i++)); do
            alive "$pid" || break
            sleep 0.05
        done
        if alive "$pid"; then
            say "containerd $pid did not stop on SIGTERM within 10 s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.2
        fi
    fi

    # 2. Whatever survived: runc containers whose bundle is ours (CRI ones
    #    live in DIR/runc; `ctr run` ones in the default runc root, shared
    #    with any other containerd), then our shims.
    if command -v runc >/dev/null; then
        local root id
        for root in "$dir"/runc/*/ /run/containerd/runc/*/; do
            [ -d "$root" ] || continue
            for id in $(runc --root "$root" list 2>/dev/null |
                awk -v d="$dir/" 'NR > 1 && index($4, d) == 1 {print $1}'); do
                runc --root "$root" kill -a "$id" KILL 2>/dev/null || true
                runc --root "$root" delete -f "$id" 2>/dev/null || true
            done
        done
    fi
    local addr
    for addr in "$dir"/state/io.containerd.runtime.v2.task/*/*/address; do
        [ -f "$addr" ] || continue
        local a
        a=$(cat "$addr" 2>/dev/null || true)
        a=${a#unix://}
        case "$a" in
        /run/containerd/s/*) rm -f "$a" ;;
        esac
    done
    local shims
    shims=$(shim_pids "$sock")
    if [ -n "$shims" ]; then
        # shellcheck disable=SC2086
        kill -KILL $shims 2>/dev/null || true
    fi

    # 3. Mounts under DIR: rootfs overlays, sandbox shm, pod network namespaces.
    local m left=""
    while IFS= read -r m; do
        [ -n "$m" ] || continue
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || left+="$m "
    done < <(mounts_under "$dir")
    [ -z "$left" ] || say "could not unmount: $left"

    # 4. Network: the bridge, iptables rules of our network, the subnet claim.
    local n
    if n=$(cat "$dir/cni-index" 2>/dev/null); then
        remove_iptables_rules "tinylet-$n"
        if ip link show "tinylet$n" >/dev/null 2>&1; then
            ip link del "tinylet$n" 2>/dev/null || say "could not delete bridge tinylet$n"
        fi
        release_subnet "$dir"
    fi
    rm -f "$sock" "$sock.ttrpc" "$dir/containerd.pid"
    [ -z "$left" ] || die "mounts remain under $dir; do not delete it"
}

case "$cmd" in
start) start "$dir_arg" ;;
stop) stop "$dir_arg" ;;
*) die "unknown command '$cmd'; usage: containerd-private.sh start|stop DIR" ;;
esac
