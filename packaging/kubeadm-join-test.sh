#!/usr/bin/env bash
# A real `kubeadm join` (v1.20.2) with tinylet as the kubelet, against the
# control plane built by ../shared/tools/kube-control-plane/build.sh
# ($KCP_DIR, default /var/lib/kube-control-plane), started with bootstrap
# tokens and the csrapproving and csrsigning controllers. Without that
# control plane it says so and does nothing; CI does not run it.
#
# kubeadm writes fixed paths of the machine: /etc/kubernetes and
# /var/lib/kubelet. The test is skipped when either exists, and removes
# both when it ends (after unmounting what pods left mounted).
#
# What it does, as an operator would:
#   kubeadm's phases make the cluster ready for joins and print a join
#   command with a fresh token (the tool's bootstrap-token.sh); a private
#   containerd is the node's runtime; `kubelet` on PATH is a link to
#   tinylet, which kubeadm's preflight runs as `kubelet --version`; `kubeadm
#   join` runs with no --ignore-preflight-errors but FileExisting-crictl
#   (Debian has no crictl); the agent starts as the package's kubelet.service
#   starts it (kubeadm's flags env file, the bootstrap kubeconfig), since
#   kubeadm cannot restart a service without systemd.
# What it checks:
#   1 the preflight passes the kubelet version check and join exits 0;
#   2 the bootstrap CSR was approved and issued to the bootstrap token;
#   3 kubelet.conf names <root-dir>/pki/kubelet-client-current.pem, a link
#     to a dated pair;
#   4 healthz answers ok on 127.0.0.1:10248;
#   5 the Node is Ready and reports the version `kubelet --version` prints;
#   6 a scheduled pod runs and `kubectl logs` reads it through the node API;
#   7 with serverTLSBootstrap in the cluster's kubelet configuration, the
#     node asks for a serving certificate, which `kubectl certificate
#     approve` makes port 10250 serve, verified with the cluster's CA;
#   8 the client certificate (8 minutes from the signer, backdated 5, so 3
#     left at issue) is renewed with the node's own credentials before it
#     ends, and past its end the node is still Ready, renews its Lease and
#     serves `kubectl logs`, with the pod not restarted.
#
#   bash packaging/kubeadm-join-test.sh        # uses $TINYLET_BIN or builds
# Needs root. Environment: KCP_DIR, TINYLET_BIN, CARGO_TARGET_DIR,
# TINYLET_KUBELET_VERSION (reported and checked by kubeadm).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

KCP=${KCP_DIR:-/var/lib/kube-control-plane}
say() { echo "kubeadm-join-test.sh: $*" >&2; }
if [ ! -x "$KCP/start.sh" ] || [ ! -x "$KCP/bootstrap-token.sh" ] || [ ! -x "$KCP/bin/kubeadm" ]; then
    say "skipped: no control plane with kubeadm at $KCP (build one with ../shared/tools/kube-control-plane/build.sh)"
    exit 0
fi
[ "$(id -u)" = 0 ] || { say "must run as root"; exit 1; }
for p in /etc/kubernetes /var/lib/kubelet; do
    if [ -e "$p" ]; then
        say "skipped: $p exists (kubeadm join would write into it and this test would remove it)"
        exit 0
    fi
done
# kubeadm's preflight needs these on PATH (conntrack is fatal).
missing=()
for tool in conntrack ethtool socat; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} (kubeadm's preflight checks for them)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/tinylet/target}
if [ -z "${TINYLET_BIN:-}" ]; then
    cargo build --offline --bin tinylet >&2 2>/dev/null || cargo build --bin tinylet >&2
    TINYLET_BIN=$CARGO_TARGET_DIR/debug/tinylet
fi
KUBECTL="$KCP/bin/kubectl --kubeconfig $KCP/admin.kubeconfig"
work=$(mktemp -d /tmp/tl-join.XXXXXX)
ctd=$work/ctd
agent_pid=
passed=0

cleanup() {
    if [ -n "$agent_pid" ]; then
        kill -9 "$agent_pid" 2>/dev/null || true
        wait "$agent_pid" 2>/dev/null || true
    fi
    bash packaging/containerd-private.sh stop "$ctd" >/dev/null 2>&1 || true
    awk '$5 ~ "^/var/lib/kubelet/" {print $5}' /proc/self/mountinfo |
        sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf /etc/kubernetes /var/lib/kubelet
    "$KCP/stop.sh" --wipe >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

fail() {
    say "FAILED: $*"
    cp "$work/agent.log" /tmp/tinylet-kubeadm-join.log 2>/dev/null || true
    cp "$work/join.log" /tmp/kubeadm-join.log 2>/dev/null || true
    say "--- kubeadm join (all of it in /tmp/kubeadm-join.log) ---"
    grep -v '^I[0-9]' "$work/join.log" 2>/dev/null | tail -20 >&2 || true
    say "--- tinylet log (last 40 lines; all of it in /tmp/tinylet-kubeadm-join.log) ---"
    tail -40 "$work/agent.log" >&2 || true
    echo "kubeadm-join: $passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); say "ok: $*"; }

within() {
    local secs=$1; shift
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.5
    done
}

"$KCP/stop.sh" --wipe >/dev/null 2>&1 || true
BOOTSTRAP=1 CERT_TTL=8m "$KCP/start.sh" >/dev/null || fail "the control plane did not start (logs in $KCP/run)"
join=$(SERVER_TLS_BOOTSTRAP=1 "$KCP/bootstrap-token.sh" 2>"$work/token.log" | grep '^kubeadm join ') ||
    fail "bootstrap-token.sh printed no join command: $(tail -5 "$work/token.log")"
bash packaging/containerd-private.sh start "$ctd" >/dev/null 2>&1 || fail "private containerd did not start"
mkdir -p "$work/bin"
ln -s "$TINYLET_BIN" "$work/bin/kubelet"
node=$(hostname)

# 1. The join, with tinylet as `kubelet` on PATH.
read -r -a join_args <<<"${join#kubeadm join }"
(
    PATH=$work/bin:$PATH "$KCP/bin/kubeadm" join "${join_args[@]}" \
        --cri-socket "unix://$ctd/containerd.sock" \
        --ignore-preflight-errors=FileExisting-crictl >"$work/join.log" 2>&1
    echo $? >"$work/join.rc"
) &
within 60 test -f /var/lib/kubelet/kubeadm-flags.env || fail "kubeadm wrote no kubeadm-flags.env"
within 10 test -f /var/lib/kubelet/config.yaml || fail "kubeadm wrote no config.yaml"
# As kubelet.service runs it (its Environment= and EnvironmentFile= lines).
KUBELET_KUBEADM_ARGS=
# shellcheck disable=SC1091 # written by kubeadm just now
. /var/lib/kubelet/kubeadm-flags.env
# shellcheck disable=SC2086 # the unit's word splitting
PATH=$work/bin:$PATH kubelet --root-dir=/var/lib/kubelet \
    --bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
    --kubeconfig=/etc/kubernetes/kubelet.conf --config=/var/lib/kubelet/config.yaml \
    $KUBELET_KUBEADM_ARGS --image-gc-high-threshold 100 --eviction-hard 'memory.available<100Mi' \
    >"$work/agent.log" 2>&1 &
agent_pid=$!
within 300 test -f "$work/join.rc" || fail "kubeadm join did not end within 5 minutes"
[ "$(cat "$work/join.rc")" = 0 ] || fail "kubeadm join exited $(cat "$work/join.rc")"
grep -q 'This node has joined the cluster' "$work/join.log" || fail "kubeadm join did not say the node joined"
if grep -q 'KubeletVersion' "$work/join.log"; then fail "the preflight complained about the kubelet version"; fi
ok "kubeadm join exited 0; its preflight ran '$(PATH=$work/bin:$PATH kubelet --version)' and passed"

# 2. The bootstrap CSR, approved and issued to the token.
csr=$($KUBECTL get csr -o jsonpath='{range .items[*]}{.metadata.name} {.spec.signerName} {.spec.username} {.status.conditions[0].type} {.status.certificate}{"\n"}{end}' |
    awk '$2 == "kubernetes.io/kube-apiserver-client-kubelet" && $3 ~ /^system:bootstrap:/')
read -r csr_name _ csr_user csr_state csr_cert <<<"$csr"
[ "$csr_state" = Approved ] && [ -n "$csr_cert" ] || fail "no approved and issued bootstrap CSR: '$csr'"
ok "CSR $csr_name from $csr_user approved and issued"

# 3. kubelet.conf and the client pair.
current=/var/lib/kubelet/pki/kubelet-client-current.pem
grep -q "client-certificate: \"$current\"" /etc/kubernetes/kubelet.conf ||
    fail "kubelet.conf does not name $current: $(grep client- /etc/kubernetes/kubelet.conf)"
target=$(readlink "$current") || fail "$current is not a link"
[[ $target == kubelet-client-20*.pem ]] || fail "$current links to $target"
openssl x509 -in "$current" -noout -subject | sed 's/ = /=/g' | grep -q "O=system:nodes, CN=system:node:$node" ||
    fail "the issued certificate's subject: $(openssl x509 -in "$current" -noout -subject)"
ok "kubelet.conf names $current -> $target (CN=system:node:$node)"

# 4. kubeadm's health check.
within 10 sh -c '[ "$(curl -fsS http://127.0.0.1:10248/healthz)" = ok ]' || fail "healthz on 127.0.0.1:10248"
ok "healthz ok on 127.0.0.1:10248"

# 5. The Node.
within 30 $KUBECTL wait --for=condition=Ready "node/$node" --timeout=2s || fail "node $node not Ready"
reported=$($KUBECTL get node "$node" -o jsonpath='{.status.nodeInfo.kubeletVersion}')
printed=$(PATH=$work/bin:$PATH kubelet --version)
[ "Kubernetes $reported" = "$printed" ] || fail "the Node reports $reported, kubelet --version prints $printed"
ok "node $node Ready, kubeletVersion $reported"

# 6. A scheduled pod and its log through the node API.
cat <<EOF | $KUBECTL apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: joined, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  containers:
  - name: app
    image: docker.io/tinylet/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "echo hello from a joined node; sleep 3600"]
EOF
within 60 $KUBECTL wait --for=condition=Ready pod/joined --timeout=2s || fail "pod joined not Ready"
on=$($KUBECTL get pod joined -o jsonpath='{.spec.nodeName}')
[ "$on" = "$node" ] || fail "pod joined was scheduled to '$on'"
within 10 sh -c "$KUBECTL logs joined | grep -q 'hello from a joined node'" || fail "kubectl logs joined"
ok "pod joined scheduled to $node, Running; kubectl logs reads it"

# 7. The serving certificate: asked for at start, approved by hand.
grep -q '^serverTLSBootstrap: true' /var/lib/kubelet/config.yaml || fail "config.yaml does not set serverTLSBootstrap"
serving_csr() {
    $KUBECTL get csr -o jsonpath='{range .items[*]}{.metadata.name} {.spec.signerName} {.spec.username}{"\n"}{end}' |
        awk -v u="system:node:$node" '$2 == "kubernetes.io/kubelet-serving" && $3 == u {print $1}' | head -n1
}
within 30 sh -c "[ -n \"\$($KUBECTL get csr -o jsonpath='{.items[*].spec.signerName}' | grep -o kubernetes.io/kubelet-serving)\" ]" ||
    fail "no kubelet-serving CSR"
name=$(serving_csr)
[ -n "$name" ] || fail "the kubelet-serving CSR is not from system:node:$node"
grep -q "kubectl certificate approve $name" "$work/agent.log" || fail "the log does not say to approve $name"
verify_serving() {
    openssl s_client -connect 127.0.0.1:10250 -CAfile "$KCP/pki/ca.crt" -verify_return_error \
        -verify_hostname "$node" </dev/null 2>/dev/null | grep -q 'Verify return code: 0 (ok)'
}
if verify_serving; then fail "port 10250 served a cluster-signed certificate before the approval"; fi
$KUBECTL certificate approve "$name" >/dev/null || fail "kubectl certificate approve $name"
within 30 verify_serving || fail "port 10250 does not serve the approved certificate"
ok "serving CSR $name approved by hand; port 10250 serves it, verified with the cluster CA for $node"

# 8. Rotation: kubeadm's config sets rotateCertificates.
grep -q '^rotateCertificates: true' /var/lib/kubelet/config.yaml || fail "kubeadm's config.yaml does not set rotateCertificates"
first_end=$(date -d "$(openssl x509 -in "$current" -noout -enddate | cut -d= -f2)" +%s)
renewals() {
    $KUBECTL get csr -o jsonpath='{range .items[*]}{.spec.username} {.status.certificate}{"\n"}{end}' |
        awk -v u="system:node:$node" '$1 == u && $2 != ""' | wc -l
}
left=$((first_end - $(date +%s)))
within $((left + 30)) sh -c "[ \$(readlink $current) != $target ]" ||
    fail "the client certificate was not renewed before it ended ($left s after the join)"
[ "$(renewals)" -ge 1 ] || fail "no renewal CSR from system:node:$node was issued"
now=$(date +%s)
[ "$now" -lt "$first_end" ] || fail "renewed only after the first certificate ended"
ok "client certificate renewed $((first_end - now)) s before the first one ended, asked as system:node:$node"
sleep $((first_end - $(date +%s) + 15))
renew_before=$($KUBECTL -n kube-node-lease get lease "$node" -o jsonpath='{.spec.renewTime}')
within 30 sh -c "[ \"\$($KUBECTL -n kube-node-lease get lease $node -o jsonpath='{.spec.renewTime}')\" != '$renew_before' ]" ||
    fail "the Lease is not renewed after the first certificate ended"
$KUBECTL wait --for=condition=Ready "node/$node" --timeout=5s >/dev/null || fail "node $node not Ready after the first certificate ended"
$KUBECTL logs joined | grep -q 'hello from a joined node' || fail "kubectl logs after the first certificate ended"
restarts=$($KUBECTL get pod joined -o jsonpath='{.status.containerStatuses[0].restartCount}')
[ "$restarts" = 0 ] || fail "the pod restarted $restarts times"
ok "past the first certificate's end: Lease renewed, node Ready, kubectl logs works, pod not restarted"

echo "kubeadm-join: $passed passed, 0 failed"
