#!/usr/bin/env bash
# Runs tinylet as an embedded device would: a containerd of its own, a static
# pod manifest in a directory, and tinylet in the foreground keeping that pod
# running. Needs root. Ctrl-C stops tinylet and the private containerd (and
# with it the pod).
#
#   bash packaging/demo.sh            # state under /var/tmp/tinylet-demo
#   TINYLET_DEMO_DIR=/some/dir bash packaging/demo.sh
#
# While it runs, from another shell:
#   ctr --address /var/tmp/tinylet-demo/containerd/containerd.sock -n k8s.io tasks ls
#   edit or remove /var/tmp/tinylet-demo/manifests/clock.yaml and watch tinylet react
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd)
demo=${TINYLET_DEMO_DIR:-/var/tmp/tinylet-demo}
ctd_dir="$demo/containerd"
manifests="$demo/manifests"
root_dir="$demo/root"
node=${TINYLET_DEMO_NODE:-demo-node}

step() { printf '\n==> %s\n' "$*"; }

step "1/5 checking build and runtime dependencies (packaging/deps.sh)"
bash packaging/deps.sh
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

step "2/5 building tinylet (cargo build --release)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/tinylet/target}
cargo build --release
bin="$CARGO_TARGET_DIR/release/tinylet"
ls -l "$bin"

started_containerd=no
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ "$started_containerd" = yes ]; then
        step "stopping the private containerd and its pods"
        bash "$repo/packaging/containerd-private.sh" stop "$ctd_dir" || true
    fi
    echo "demo state left in $demo (remove it with: rm -rf $demo)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "3/5 starting a private containerd in $ctd_dir"
mkdir -p "$demo" "$manifests" "$root_dir"
# A previous demo killed hard may have left one running.
bash packaging/containerd-private.sh stop "$ctd_dir" >/dev/null 2>&1 || true
bash packaging/containerd-private.sh start "$ctd_dir"
started_containerd=yes
echo "CRI endpoint: unix://$ctd_dir/containerd.sock"

step "4/5 writing a static pod manifest to $manifests/clock.yaml"
cat >"$manifests/.clock.yaml.tmp" <<'EOF'
apiVersion: v1
kind: Pod
metadata:
  name: clock
  labels:
    app: clock
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: clock
    image: docker.io/tinylet/busybox:1
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do date; sleep 5; done"]
EOF
mv "$manifests/.clock.yaml.tmp" "$manifests/clock.yaml"
cat "$manifests/clock.yaml"

step "5/5 running tinylet in the foreground (Ctrl-C to stop)"
echo "the pod will be named clock-$node; look at it with:"
echo "  ctr --address $ctd_dir/containerd.sock -n k8s.io containers ls 'labels.\"io.kubernetes.pod.name\"==clock-$node'"
echo "  ctr --address $ctd_dir/containerd.sock -n k8s.io tasks ls"
args=(
    --container-runtime-endpoint "unix://$ctd_dir/containerd.sock"
    --pod-manifest-path "$manifests"
    --hostname-override "$node"
    --root-dir "$root_dir"
    # The demo's image was imported (built here from busybox-static) and
    # cannot be pulled again, so nothing may remove it: image GC, which on
    # a disk over its 85% high threshold removes unused images at start (as
    # upstream, images found at start count as old), is off, and so is the
    # eviction threshold that reclaims images (imagefs.available<15%); the
    # others keep upstream's defaults.
    --image-gc-high-threshold 100
    --eviction-hard "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%"
    --v 2
)
echo "+ $bin ${args[*]}"
"$bin" "${args[@]}"
