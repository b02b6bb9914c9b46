#!/usr/bin/env bash
# Builds tinylet for release and runs the pod start benchmark
# (benches/pod_start.rs) against a private containerd, printing a table of
# pod start and removal times beside containerd's own floor and the upstream
# kubelet's numbers, tinylet's footprint, and the targets; then the cluster
# part: tinylet joined to the tests' fake apiserver, its footprint idle and
# with 110 API pods, the API requests it sends idle, and API pod start and
# status times; then the node API (benches/node_api.rs): idle RSS and
# threads with the server on, 1000 idle connections, /healthz and an
# authenticated /pods latency beside 200 slow TLS handshakes, exec first-byte time
# and port-forward throughput beside the runtime's own streaming server,
# and the CPU of a `logs -f`; then the watched objects (benches/objects.rs):
# RSS, threads, apiserver connections and idle bytes a day of 20 pods each
# mounting a ConfigMap and a Secret, beside 20 pods without; and one pod
# referencing 1,100 ConfigMaps: the agent's threads, open files and RSS,
# and another pod's start time before and after it; then the idle
# control-plane bytes (benches/idle_bytes.rs, about 12 minutes): bytes a day
# through a counting relay in front of the fake apiserver, TLS included,
# with 10 pods, for the default and the low-data profiles. Needs root.
#
#   bash packaging/bench.sh                  # the full run, about 21-23 minutes
#   bash packaging/bench.sh --quick          # a smoke run, about 5 minutes
#   bash packaging/bench.sh --host-network   # also the host-network cases
#   bash packaging/bench.sh --max-pods 0     # skip the RSS points at 110 pods
#   bash packaging/bench.sh --no-cluster     # skip the cluster part
#   bash packaging/bench.sh --cluster-only   # only the cluster part
#   bash packaging/bench.sh --no-node-api    # skip the node API part
#   bash packaging/bench.sh --no-objects     # skip the watched objects part
#   bash packaging/bench.sh --objects-only   # only the watched objects part
#   bash packaging/bench.sh --no-idle-bytes  # skip the idle bytes part
#   bash packaging/bench.sh --idle-bytes-only  # only the idle bytes part
#   bash packaging/bench.sh --referenced-only  # only its 1,100 referenced
#                                            # objects (about a minute)
#   bash packaging/bench.sh --slow-clients-only  # only the node API's slow-client
#                                            # latencies (about a minute)
#   bash packaging/bench.sh --baseline OLD   # pod start part for the binary OLD
#                                            # first, then for this tree's, in one run
#
# Other options are passed to the benchmark (see its header). The machine
# should be otherwise idle: pod starts are CPU-bound, so anything else
# running shows up in the numbers (the table prints the load average).
#
# Environment: CARGO_TARGET_DIR (default /var/cache/tinylet/target),
# TINYLET_BIN (default $CARGO_TARGET_DIR/release/tinylet).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() { echo "bench.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it runs a private containerd)"
bash packaging/deps.sh
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/tinylet/target}
mkdir -p "$CARGO_TARGET_DIR"
echo "bench.sh: cargo build --release (target dir $CARGO_TARGET_DIR)" >&2
cargo build --release
export TINYLET_BIN=${TINYLET_BIN:-$CARGO_TARGET_DIR/release/tinylet}
[ -x "$TINYLET_BIN" ] || die "no tinylet binary at $TINYLET_BIN"

# The benchmark starts and stops this containerd itself; the trap only
# cleans up after an interrupted run. Unix socket paths must stay short.
ctd_dir=/tmp/tl-bench.$$
cleanup() {
    if [ -e "$ctd_dir/containerd.pid" ]; then
        bash packaging/containerd-private.sh stop "$ctd_dir" >&2 || true
    fi
    if [ -d "$ctd_dir" ] && ! grep -qF " $ctd_dir" /proc/self/mountinfo; then
        rm -rf "$ctd_dir"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --no-node-api is this script's; --quick and --no-cluster also shape the
# node API part.
pod_start_args=()
node_api_args=()
node_api=1
pod_start=1
objects=1
objects_only=0
objects_args=()
idle_bytes=1
idle_bytes_only=0
idle_bytes_args=()
baseline=
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    a=${args[$i]}
    case "$a" in
        --baseline) i=$((i + 1)); baseline=${args[$i]:-}; continue ;;
        --baseline=*) baseline=${a#--baseline=}; continue ;;
        --no-node-api) node_api=0; continue ;;
        --no-objects) objects=0; continue ;;
        --no-idle-bytes) idle_bytes=0; continue ;;
        --idle-bytes-only) idle_bytes_only=1; continue ;;
        --objects-only) objects_only=1; continue ;;
        --referenced-only) objects_only=1; objects_args+=("$a"); continue ;;
        --slow-clients-only) pod_start=0; objects=0; idle_bytes=0; node_api_args+=(--slow-only); continue ;;
        --quick) node_api_args+=("$a"); idle_bytes_args+=("$a") ;;
        --no-cluster) node_api_args+=("$a"); idle_bytes=0 ;;
    esac
    pod_start_args+=("$a")
done

if [ "$idle_bytes_only" = 1 ]; then
    pod_start=0
    node_api=0
    objects=0
    idle_bytes=1
fi
if [ "$objects_only" = 1 ]; then
    node_api=0
    idle_bytes=0
elif [ "$pod_start" = 1 ]; then
    if [ -n "$baseline" ]; then
        [ -x "$baseline" ] || die "--baseline: no binary at $baseline"
        echo "=== pod start part, baseline: $baseline"
        echo "bench.sh: load average $(cut -d' ' -f1-3 /proc/loadavg) before the baseline run" >&2
        cargo bench --bench pod_start -- --containerd-dir "$ctd_dir" --tinylet "$baseline" ${pod_start_args[@]+"${pod_start_args[@]}"}
        echo "=== pod start part, this tree: $TINYLET_BIN"
    fi
    echo "bench.sh: load average $(cut -d' ' -f1-3 /proc/loadavg) before the run" >&2
    cargo bench --bench pod_start -- --containerd-dir "$ctd_dir" ${pod_start_args[@]+"${pod_start_args[@]}"}
fi

if [ "$node_api" = 1 ]; then
    echo "bench.sh: the node API part; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    TINYLET_E2E_BIN="$TINYLET_BIN" cargo bench --bench node_api -- ${node_api_args[@]+"${node_api_args[@]}"}
fi

if [ "$objects" = 1 ]; then
    echo "bench.sh: the watched objects part; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    TINYLET_E2E_BIN="$TINYLET_BIN" cargo bench --bench objects -- ${objects_args[@]+"${objects_args[@]}"}
fi

if [ "$idle_bytes" = 1 ]; then
    echo "bench.sh: the idle control-plane bytes part; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    cargo bench --bench idle_bytes -- ${idle_bytes_args[@]+"${idle_bytes_args[@]}"}
fi
