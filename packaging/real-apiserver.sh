#!/usr/bin/env bash
# The test tier against a real kube-apiserver (v1.20.2, Node and RBAC
# authorizers, NodeRestriction), run when the control plane built by
# ../shared/tools/kube-control-plane/build.sh is present ($KCP_DIR, default
# /var/lib/kube-control-plane); otherwise it says so and does nothing.
#
# It wipes that control plane's objects and starts it, starts a private
# containerd, and runs tinylet as node edge-1 with the node's client
# certificate, then checks with kubectl what a cluster user sees:
#   the Node is Ready with node info; an API pod runs and reports Running
#   with containerd's container ID; a pod with the default service account
#   token volume reads its token; a static pod gets its mirror pod; a
#   crashing pod shows CrashLoopBackOff; events are posted; a graceful
#   delete stops the pod within its grace period and removes the object;
#   an apiserver restart loses, restarts and duplicates nothing; through
#   the apiserver to the node's port 10250, kubectl logs (and -f), exec
#   with stdin and an exit code, attach and port-forward work, and another
#   node's credentials (403) or none (401) are refused; a pod's env comes
#   from a ConfigMap, a Secret and the kubernetes Service; a ConfigMap
#   volume follows an edit within seconds (watched).
#
#   bash packaging/real-apiserver.sh            # uses $TINYLET_BIN or builds
# Needs root. Environment: KCP_DIR, TINYLET_BIN, CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

KCP=${KCP_DIR:-/var/lib/kube-control-plane}
say() { echo "real-apiserver.sh: $*" >&2; }
if [ ! -x "$KCP/start.sh" ] || [ ! -f "$KCP/node-edge-1.kubeconfig" ]; then
    say "skipped: no control plane at $KCP (build one with ../shared/tools/kube-control-plane/build.sh)"
    exit 0
fi
[ "$(id -u)" = 0 ] || { say "must run as root"; exit 1; }

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/tinylet/target}
if [ -z "${TINYLET_BIN:-}" ]; then
    cargo build --offline --bin tinylet >&2 2>/dev/null || cargo build --bin tinylet >&2
    TINYLET_BIN=$CARGO_TARGET_DIR/debug/tinylet
fi
KUBECTL="$KCP/bin/kubectl --kubeconfig $KCP/admin.kubeconfig"
work=$(mktemp -d /tmp/tl-real.XXXXXX)
ctd=$work/ctd
tinylet_pid=
passed=0

cleanup() {
    if [ -n "$tinylet_pid" ]; then
        kill -9 "$tinylet_pid" 2>/dev/null || true
        wait "$tinylet_pid" 2>/dev/null || true
    fi
    bash packaging/containerd-private.sh stop "$ctd" >/dev/null 2>&1 || true
    # The secret volumes' tmpfs mounts outlive tinylet, as they must.
    awk -v root="$work/root/" 'index($5, root) == 1 {print $5}' /proc/self/mountinfo |
        sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    "$KCP/stop.sh" --wipe >/dev/null 2>&1 || true
    if ! grep -qF " $work" /proc/self/mountinfo; then rm -rf "$work"; fi
}
trap cleanup EXIT

fail() {
    say "FAILED: $*"
    cp "$work/tinylet.log" /tmp/tinylet-real-apiserver.log 2>/dev/null || true
    say "--- tinylet log (last 40 lines; all of it in /tmp/tinylet-real-apiserver.log) ---"
    tail -40 "$work/tinylet.log" >&2 || true
    echo "real-apiserver: $passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); say "ok: $*"; }

# Polls "$@" for up to $1 seconds until it succeeds.
within() {
    local secs=$1; shift
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.5
    done
}

# Image GC is off: on a machine whose disk is over 85% full it would remove
# the imported test image, which cannot be pulled. The disk eviction
# thresholds are off for the same reason (only memory.available is kept):
# there they would refuse and evict the test's pods.
start_tinylet() {
    "$TINYLET_BIN" --v "${TINYLET_V:-0}" --kubeconfig "$KCP/node-edge-1.kubeconfig" --hostname-override edge-1 \
        --container-runtime-endpoint "unix://$ctd/containerd.sock" \
        --pod-manifest-path "$work/manifests" --root-dir "$work/root" \
        --pod-logs-dir "$work/logs" --node-status-update-frequency 2s \
        --client-ca-file "$KCP/pki/ca.crt" \
        --image-gc-high-threshold 100 --eviction-hard 'memory.available<100Mi' \
        >>"$work/tinylet.log" 2>&1 &
    tinylet_pid=$!
}

"$KCP/stop.sh" --wipe >/dev/null 2>&1 || true
"$KCP/start.sh" >/dev/null || fail "the control plane did not start (logs in $KCP/run)"
bash packaging/containerd-private.sh start "$ctd" >/dev/null 2>&1 || fail "private containerd did not start"
image=docker.io/tinylet/busybox:1
mkdir -p "$work/manifests"
start_tinylet

# 1. The node registers and is Ready, with node info.
within 30 $KUBECTL wait --for=condition=Ready node/edge-1 --timeout=2s || fail "node edge-1 not Ready"
runtime=$($KUBECTL get node edge-1 -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}')
[[ $runtime == containerd://* ]] || fail "containerRuntimeVersion is '$runtime'"
within 15 $KUBECTL -n kube-node-lease get lease edge-1 || fail "no lease"
ok "node edge-1 Ready ($runtime), lease present"

# 2. An API pod runs and reports Running with containerd's container ID.
pod() { # NAME COMMAND GRACE
    cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  nodeName: edge-1
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: $3
  containers:
  - name: app
    image: $image
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "$2"]
EOF
}
# Pods are admitted only once the controller-manager made the default service account.
within 60 $KUBECTL -n default get serviceaccount default || fail "no default service account"
pod app "trap 'exit 0' TERM; while :; do sleep 1; done" 5 | $KUBECTL apply -f - >/dev/null ||
    fail "cannot create pod app" 
within 30 $KUBECTL wait --for=condition=Ready pod/app --timeout=2s || fail "pod app not Ready"
cid=$($KUBECTL get pod app -o jsonpath='{.status.containerStatuses[0].containerID}')
running=$(ctr -a "$ctd/containerd.sock" -n k8s.io containers ls -q 'labels."io.kubernetes.pod.name"==app,labels."io.kubernetes.container.name"==app')
[ "containerd://$running" = "$cid" ] || fail "pod app reports '$cid', containerd runs '$running'"
[ -n "$($KUBECTL get pod app -o jsonpath='{.status.podIP}')" ] || fail "pod app has no podIP"
ok "API pod Running as $cid"

# 2b. The token volume the apiserver adds by default (a Secret in 1.20, a
# projected volume later) is mounted read-only with the token, namespace and CA.
sa=/var/run/secrets/kubernetes.io/serviceaccount
pod sa "cd $sa && test -s token && grep -qx default namespace && grep -q CERTIFICATE ca.crt && ! touch x 2>/dev/null || exit 3; sleep 3600" 0 |
    sed '/automountServiceAccountToken/d' | $KUBECTL apply -f - >/dev/null || fail "cannot create pod sa"
within 30 $KUBECTL wait --for=condition=Ready pod/sa --timeout=2s || fail "pod sa (service account token) not Ready"
vol=$($KUBECTL get pod sa -o jsonpath='{.spec.volumes[0].name}')
restarts=$($KUBECTL get pod sa -o jsonpath='{.status.containerStatuses[0].restartCount}')
[ "$restarts" = 0 ] || fail "pod sa restarted $restarts times: its checks of $sa failed"
uid=$($KUBECTL get pod sa -o jsonpath='{.metadata.uid}')
tok=$(cat "$work/root/pods/$uid/volumes/kubernetes.io~secret/$vol/token" 2>/dev/null) || fail "no token file on the host"
who=$("$KCP/bin/kubectl" --server https://127.0.0.1:6443 --certificate-authority "$KCP/pki/ca.crt" \
    --token "$tok" get --raw /api 2>&1) || fail "the token in volume $vol is refused: $who"
grep -qF " $work/root/pods/$uid/volumes/kubernetes.io~secret/$vol " /proc/self/mountinfo ||
    fail "volume $vol is not a mount (secrets belong on tmpfs)"
$KUBECTL delete pod sa --wait=false >/dev/null
ok "pod sa reads its service account token (accepted by the apiserver) from tmpfs volume $vol"

# 2c. The node's API through the apiserver (it calls the node's port 10250
# with its kubelet-client certificate, which --client-ca-file trusts):
# kubectl logs, logs -f, exec with stdin and an exit code, attach and
# port-forward; a user the node's authorizer refuses gets 403, and one
# without credentials 401.
pod talk 'i=0; while :; do echo line $i; i=$((i+1)); sleep 1; done' 0 | $KUBECTL apply -f - >/dev/null ||
    fail "cannot create pod talk"
pod pf 'while :; do echo pong | nc -l -p 8080; done' 0 | $KUBECTL apply -f - >/dev/null ||
    fail "cannot create pod pf"
within 30 $KUBECTL wait --for=condition=Ready pod/talk --timeout=2s || fail "pod talk not Ready"
within 30 $KUBECTL wait --for=condition=Ready pod/pf --timeout=2s || fail "pod pf not Ready"
sleep 2
logs=$($KUBECTL logs talk 2>&1) || fail "kubectl logs talk: $logs"
grep -qx 'line 0' <<<"$logs" || fail "kubectl logs talk has no 'line 0': $logs"
follow=$(timeout 4 $KUBECTL logs -f --tail 1 talk 2>&1 || true)
[ "$(grep -c '^line ' <<<"$follow")" -ge 3 ] || fail "kubectl logs -f talk did not keep streaming: $follow"
got=$(echo hello | $KUBECTL exec -i app -- sh -c 'read x; echo got $x' 2>&1) || fail "kubectl exec -i app: $got"
[ "$got" = "got hello" ] || fail "kubectl exec -i app printed '$got'"
code=0; $KUBECTL exec app -- sh -c 'exit 3' >/dev/null 2>&1 || code=$?
[ $code = 3 ] || fail "kubectl exec app -- exit 3 exited $code"
# -it needs a terminal: script(1) gives kubectl one; the shell in the
# container sees its own TTY and gets the typed line.
tty_out=$(printf 'echo typed-$((6*7))\nexit\n' | timeout 20 script -qec \
    "$KUBECTL exec -it app -- sh -c 'tty; read l; eval \"\$l\"'" /dev/null 2>&1 || true)
grep -q '^/dev/pts/' <<<"$tty_out" && grep -q 'typed-42' <<<"$tty_out" ||
    fail "kubectl exec -it app: no TTY or no answer: $tty_out"
attached=$(timeout 4 $KUBECTL attach talk 2>&1 || true)
grep -q '^line ' <<<"$attached" || fail "kubectl attach talk showed no output: $attached"
$KUBECTL port-forward pod/pf 18080:8080 >"$work/pf.log" 2>&1 &
pf_pid=$!
pong() { exec 3<>/dev/tcp/127.0.0.1/18080 && read -r -t 5 line <&3 && exec 3<&- && [ "$line" = pong ]; }
within 20 pong || { kill $pf_pid 2>/dev/null; fail "kubectl port-forward pod/pf: no pong ($(cat "$work/pf.log"))"; }
kill $pf_pid 2>/dev/null; wait $pf_pid 2>/dev/null || true
refused=$("$KCP/bin/kubectl" --kubeconfig "$KCP/node-edge-2.kubeconfig" --server https://127.0.0.1:10250 \
    --insecure-skip-tls-verify get --raw /containerLogs/default/talk/app 2>&1) && fail "edge-2 read edge-1's logs: $refused"
grep -q Forbidden <<<"$refused" || fail "edge-2's request to edge-1's node API: '$refused', not Forbidden"
anon=$(curl -sk -w ' %{http_code}' https://127.0.0.1:10250/pods 2>&1)
[ "$anon" = "Unauthorized 401" ] || fail "an anonymous request to the node API: '$anon', not 401 Unauthorized"
$KUBECTL delete pod talk pf --wait=false >/dev/null
ok "kubectl logs, logs -f, exec -i (exit 3), exec -it (a TTY), attach and port-forward through the apiserver; edge-2 refused (403), anonymous refused (401)"

# 2d. Env from a ConfigMap and a Secret (envFrom, one with a prefix, and a
# key reference) and the kubernetes Service's variables, read back from the
# container's own output; the key that is no variable name gets its event.
$KUBECTL -n default create configmap env-config --from-literal=GREETING=hello \
    --from-literal=1st=skipped >/dev/null || fail "cannot create configmap env-config"
$KUBECTL -n default create secret generic env-secret --from-literal=token=s3cr3t >/dev/null ||
    fail "cannot create secret env-secret"
pod envy 'echo G=$GREETING T=$SECRET_token M=$MODE K=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; sleep 3600' 0 |
    sed 's/^    command:/    envFrom:\
    - configMapRef: {name: env-config}\
    - {prefix: SECRET_, secretRef: {name: env-secret}}\
    env:\
    - name: MODE\
      valueFrom: {configMapKeyRef: {name: env-config, key: GREETING}}\
    command:/' | $KUBECTL apply -f - >/dev/null || fail "cannot create pod envy"
within 30 $KUBECTL wait --for=condition=Ready pod/envy --timeout=2s || fail "pod envy not Ready"
kube_ip=$($KUBECTL -n default get service kubernetes -o jsonpath='{.spec.clusterIP}')
envlog=$($KUBECTL logs envy 2>&1) || fail "kubectl logs envy: $envlog"
[ "$envlog" = "G=hello T=s3cr3t M=hello K=$kube_ip:443" ] ||
    fail "pod envy printed '$envlog' (kubernetes service at $kube_ip:443)"
within 15 sh -c "$KUBECTL get events --field-selector reason=InvalidEnvironmentVariableNames,involvedObject.name=envy -o name | grep -q ." ||
    fail "no InvalidEnvironmentVariableNames event for pod envy"
$KUBECTL delete pod envy --wait=false >/dev/null
ok "pod envy reads env from configmap and secret (envFrom, prefix, key ref) and KUBERNETES_SERVICE_HOST=$kube_ip; InvalidEnvironmentVariableNames event"

# 2e. A ConfigMap volume follows an edit within seconds: the object is
# watched (on the watch-mux thread, over TLS, as the Node authorizer allows
# a node to watch one name), not read again at the next periodic sync.
$KUBECTL -n default create configmap vol-config --from-literal=key=one >/dev/null ||
    fail "cannot create configmap vol-config"
pod vol 'sleep 3600' 0 |
    sed 's/^  containers:/  volumes:\
  - name: cfg\
    configMap: {name: vol-config}\
  containers:/' | $KUBECTL apply -f - >/dev/null || fail "cannot create pod vol"
within 30 $KUBECTL wait --for=condition=Ready pod/vol --timeout=2s || fail "pod vol not Ready"
vol_uid=$($KUBECTL get pod vol -o jsonpath='{.metadata.uid}')
vol_file=$work/root/pods/$vol_uid/volumes/kubernetes.io~configmap/cfg/key
[ "$(cat "$vol_file" 2>/dev/null)" = one ] || fail "$vol_file does not hold 'one'"
$KUBECTL -n default patch configmap vol-config -p '{"data":{"key":"two"}}' >/dev/null ||
    fail "cannot edit configmap vol-config"
edited=$SECONDS
within 15 sh -c "[ \"\$(cat '$vol_file')\" = two ]" || fail "$vol_file still holds '$(cat "$vol_file")' 15 s after the edit"
took=$((SECONDS - edited))
muxes=$(cat /proc/"$tinylet_pid"/task/*/comm | grep -c '^watch-mux$' || true)
[ "$muxes" = 1 ] || fail "$muxes watch-mux threads"
$KUBECTL delete pod vol --wait=false >/dev/null
ok "configmap volume of pod vol followed an edit in ${took}s (watched, one watch-mux thread)"

# 3. A static pod gets its mirror pod.
cat >"$work/manifests/.web.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers:
  - name: web
    image: $image
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
EOF
mv "$work/manifests/.web.yaml" "$work/manifests/web.yaml"
within 30 $KUBECTL wait --for=condition=Ready pod/web-edge-1 --timeout=2s || fail "mirror pod web-edge-1 not Ready"
mirror=$($KUBECTL get pod web-edge-1 -o jsonpath='{.metadata.annotations.kubernetes\.io/config\.mirror}')
[ -n "$mirror" ] || fail "web-edge-1 has no config.mirror annotation"
ok "static pod web has mirror pod web-edge-1 ($mirror)"

# 4. A crashing pod shows CrashLoopBackOff with restarts climbing, and events.
pod crash "sleep 1; exit 3" 0 | $KUBECTL apply -f - >/dev/null || fail "cannot create pod crash" 
crashloop() {
    [ "$($KUBECTL get pod crash -o jsonpath='{.status.containerStatuses[0].state.waiting.reason}')" = CrashLoopBackOff ] &&
        [ "$($KUBECTL get pod crash -o jsonpath='{.status.containerStatuses[0].restartCount}')" -ge 1 ]
}
within 60 crashloop || fail "pod crash never showed CrashLoopBackOff"
events=$($KUBECTL get events --field-selector involvedObject.name=crash -o jsonpath='{.items[*].reason}')
[[ $events == *Started* && $events == *BackOff* ]] || fail "events for crash: '$events'"
$KUBECTL delete pod crash --wait=false >/dev/null
ok "CrashLoopBackOff shown, events: $events"

# 5. An apiserver restart: nothing restarted, nothing duplicated.
before=$(ctr -a "$ctd/containerd.sock" -n k8s.io containers ls -q | sort)
"$KCP/stop.sh" >/dev/null
sleep 15
"$KCP/start.sh" >/dev/null || fail "the control plane did not restart"
within 60 $KUBECTL wait --for=condition=Ready node/edge-1 --timeout=2s || fail "node not Ready after the restart"
within 30 $KUBECTL wait --for=condition=Ready pod/app --timeout=2s || fail "pod app not Ready after the restart"
sleep 3
gone_crash() { ! ctr -a "$ctd/containerd.sock" -n k8s.io containers ls -q 'labels."io.kubernetes.pod.name"==crash' | grep -q .; }
within 30 gone_crash || fail "pod crash's containers remain"
after=$(ctr -a "$ctd/containerd.sock" -n k8s.io containers ls -q | sort)
for id in $(ctr -a "$ctd/containerd.sock" -n k8s.io containers ls -q 'labels."io.kubernetes.pod.name"==app') \
    $(ctr -a "$ctd/containerd.sock" -n k8s.io containers ls -q 'labels."io.kubernetes.pod.name"==web-edge-1'); do
    grep -qx "$id" <<<"$before" || fail "container $id is new after the apiserver restart"
done
ok "apiserver restart: app and web kept their containers"

# 6. A graceful delete stops the pod within its grace period and removes it.
# First a pod created after the restart must run: the watch is back.
pod probe "sleep 3600" 0 | $KUBECTL apply -f - >/dev/null || fail "cannot create pod probe"
within 60 $KUBECTL wait --for=condition=Ready pod/probe --timeout=2s ||
    fail "pod probe, created after the apiserver restart, never ran"
start=$SECONDS
$KUBECTL delete pod app --timeout=30s >/dev/null || fail "kubectl delete pod app did not finish"
took=$((SECONDS - start))
gone_app() { ! ctr -a "$ctd/containerd.sock" -n k8s.io containers ls -q 'labels."io.kubernetes.pod.name"==app' | grep -q .; }
within 10 gone_app || fail "pod app's containers remain after the delete"
[ $took -le 10 ] || fail "deleting pod app took ${took}s (grace 5s)"
ok "graceful delete of app in ${took}s"

# 7. Removing the manifest removes the mirror pod.
rm "$work/manifests/web.yaml"
no_mirror() { ! $KUBECTL get pod web-edge-1; }
within 30 no_mirror || fail "mirror pod web-edge-1 not deleted"
ok "mirror pod deleted with its static pod"

echo "real-apiserver: $passed passed, 0 failed"
