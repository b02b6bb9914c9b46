#!/usr/bin/env bash
# The test tier against a real kube-apiserver (v1.20.2, Node and RBAC
# authorizers, NodeRestriction), run when the control plane built by
# ../shared/tools/kube-control-plane/build.sh is present ($KCP_DIR, default
# /var/lib/kube-control-plane); otherwise it says so and does nothing.
#
# It wipes that control plane's objects and starts it, starts a private
# containerd, and runs tinylet as node edge-1 with the node's client
# certificate, then checks with kubectl what a cluster user sees:
#   the Node is Ready with node info; its heartbeats go over HTTP/2 (bytes
#   counted with ss); an API pod runs and reports Running
#   with containerd's container ID; a pod with the default service account
#   token volume reads its token; a static pod gets its mirror pod; a
#   crashing pod shows CrashLoopBackOff; events are posted; a graceful
#   delete stops the pod within its grace period and removes the object;
#   an apiserver restart loses, restarts and duplicates nothing; through
#   the apiserver to the node's port 10250, kubectl logs (and -f), exec
#   with stdin and an exit code, attach and port-forward work, and another
#   node's credentials (403) or none (401) are refused; a pod's env comes
#   from a ConfigMap, a Secret (envFrom and secretKeyRef), the kubernetes
#   Service and another Service of the namespace; ConfigMap and Secret
#   volumes follow an edit within seconds (watched); the node API checks a
#   user's bearer token by TokenReview and the user's rights by
#   SubjectAccessReview (200, 403, 401); a missing ConfigMap key holds a
#   container in CreateContainerConfigError until it exists;
#   activeDeadlineSeconds fails a pod with DeadlineExceeded; a readiness
#   gate holds Ready until its condition is set; an ephemeral container
#   added with `kubectl debug` runs (the apiserver is run with
#   --feature-gates=EphemeralContainers=true, which v1.20 needs); a pod
#   over its emptyDir's sizeLimit is evicted and reported Failed/Evicted;
#   after a restart with the Get and then the Cache strategy, a Secret
#   volume still follows an edit.
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
    # tinylet's whole log stays for a look after the run.
    cp "$work/tinylet.log" /tmp/tinylet-real-apiserver.log 2>/dev/null || true
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
    say "--- tinylet log (last 40 lines; all of it in /tmp/tinylet-real-apiserver.log after the run) ---"
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
start_tinylet() { # [FLAG...]
    "$TINYLET_BIN" --v "${TINYLET_V:-0}" --kubeconfig "$KCP/node-edge-1.kubeconfig" --hostname-override edge-1 \
        --container-runtime-endpoint "unix://$ctd/containerd.sock" \
        --pod-manifest-path "$work/manifests" --root-dir "$work/root" \
        --pod-logs-dir "$work/logs" --node-status-update-frequency 2s \
        --client-ca-file "$KCP/pki/ca.crt" --authentication-token-webhook \
        --image-gc-high-threshold 100 --eviction-hard 'memory.available<100Mi' "$@" \
        >>"$work/tinylet.log" 2>&1 &
    tinylet_pid=$!
}
stop_tinylet() {
    kill -TERM "$tinylet_pid"
    for _ in $(seq 150); do kill -0 "$tinylet_pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$tinylet_pid" 2>/dev/null && fail "tinylet did not stop within 15 s of SIGTERM"
    wait "$tinylet_pid" 2>/dev/null || true
    tinylet_pid=
}

# The apiserver as the control-plane tool starts it, plus the feature gate
# v1.20 needs to serve ephemeral containers (pods/ephemeralcontainers):
# started again with its own command line and the gate.
apiserver_ready() {
    curl -s --max-time 2 --cacert "$KCP/pki/ca.crt" --cert "$KCP/pki/admin.crt" \
        --key "$KCP/pki/admin.key" https://127.0.0.1:6443/readyz 2>/dev/null | grep -qx ok
}
with_ephemeral_containers() {
    local pid args
    pid=$(cat "$KCP/run/kube-apiserver.pid")
    mapfile -d '' args <"/proc/$pid/cmdline"
    [[ " ${args[*]} " != *" --feature-gates=EphemeralContainers=true "* ]] || return 0
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    setsid nohup "${args[@]}" --feature-gates=EphemeralContainers=true \
        >>"$KCP/run/kube-apiserver.log" 2>&1 </dev/null &
    echo $! >"$KCP/run/kube-apiserver.pid"
    within 120 apiserver_ready || fail "kube-apiserver with EphemeralContainers=true did not become ready"
    # The controller-manager exits when the apiserver goes away while it
    # starts: the tool starts again what is not running.
    "$KCP/start.sh" >/dev/null || fail "the control plane did not come back with the gate (logs in $KCP/run)"
}

# The apiserver as admin (curl), for what kubectl v1.20 cannot do: a
# pod's status subresource. Not as "curl": the apiserver pretty-prints
# its answers to curl, and that encoder crashes this build of v1.20.2
# (Go 1.19 under json-iterator's old reflect2: "fatal error: fault").
admin_curl() {
    curl -sS --max-time 10 -A real-apiserver.sh --cacert "$KCP/pki/ca.crt" --cert "$KCP/pki/admin.crt" \
        --key "$KCP/pki/admin.key" "$@"
}

"$KCP/stop.sh" --wipe >/dev/null 2>&1 || true
"$KCP/start.sh" >/dev/null || fail "the control plane did not start (logs in $KCP/run)"
with_ephemeral_containers
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

# 1b. Renewals: merge patches whose answers (asked for in protobuf) the
# node reads: renewTime moves on, the lease stays the node's, owned by its
# Node, and the node logs no lease error.
lease_field() { $KUBECTL -n kube-node-lease get lease edge-1 -o jsonpath="$1"; }
first=$(lease_field '{.spec.renewTime}')
sleep 11
later=$(lease_field '{.spec.renewTime}')
[[ $later > $first ]] || fail "lease renewTime did not move in 11 s: $first -> $later"
[ "$(lease_field '{.spec.holderIdentity}/{.metadata.ownerReferences[0].kind}')" = edge-1/Node ] ||
    fail "lease holder/owner: $(lease_field '{.spec.holderIdentity}/{.metadata.ownerReferences[0].kind}')"
! grep -E "node lease: .*(invalid|cannot decode)" "$work/tinylet.log" >/dev/null ||
    fail "lease renewal errors: $(grep -E 'node lease: ' "$work/tinylet.log" | tail -3)"
ok "lease renewed by merge patch, its answer in protobuf: renewTime $first -> $later, held by edge-1, owned by its Node"

# 1c. Heartbeats go over HTTP/2, as upstream's client's requests do: after
# the first renewal each header is an HPACK index. ss counts the TCP
# payload (TLS included) of each of the node's connections to the
# apiserver; over 60 s the heartbeat connection carries about six renewals.
grep -q "heartbeats over HTTP/2" "$work/tinylet.log" || fail "heartbeats did not go over HTTP/2"
socket_bytes() { # "local-port sent+received" per connection of tinylet to the apiserver
    ss -tinpH state established dst 127.0.0.1:6443 | awk -v pid="pid=$tinylet_pid," '
        /users:/ { keep = index($0, pid) > 0; n = split($3, a, ":"); port = a[n]; next }
        keep { t = 0; for (i = 1; i <= NF; i++) if ($i ~ /^bytes_(sent|received):/) { split($i, b, ":"); t += b[2] }
               print port, t; keep = 0 }' | sort
}
before=$(socket_bytes)
sleep 60
heartbeat_bytes=$(join <(echo "$before") <(socket_bytes) | awk '{ d = $3 - $2; if (d > m) m = d } END { print m + 0 }')
per_renewal=$((heartbeat_bytes / 6))
[ "$per_renewal" -gt 100 ] && [ "$per_renewal" -lt 1000 ] ||
    fail "the heartbeat connection carried $heartbeat_bytes bytes in 60 s (HTTP/1.1 renewals take about 1250 each)"
ok "heartbeats over HTTP/2: $heartbeat_bytes bytes in 60 s on the heartbeat connection, about $per_renewal a renewal ($(awk -v b="$heartbeat_bytes" 'BEGIN { printf "%.1f", b * 1440 / 1e6 }') MB a day)"

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
$KUBECTL -n default create service clusterip web-svc --tcp=80:8080 >/dev/null ||
    fail "cannot create service web-svc"
pod envy 'echo G=$GREETING T=$SECRET_token S=$TOKEN M=$MODE K=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT W=$WEB_SVC_SERVICE_HOST:$WEB_SVC_SERVICE_PORT; sleep 3600' 0 |
    sed 's/^    command:/    envFrom:\
    - configMapRef: {name: env-config}\
    - {prefix: SECRET_, secretRef: {name: env-secret}}\
    env:\
    - name: MODE\
      valueFrom: {configMapKeyRef: {name: env-config, key: GREETING}}\
    - name: TOKEN\
      valueFrom: {secretKeyRef: {name: env-secret, key: token}}\
    command:/' | $KUBECTL apply -f - >/dev/null || fail "cannot create pod envy"
within 30 $KUBECTL wait --for=condition=Ready pod/envy --timeout=2s || fail "pod envy not Ready"
kube_ip=$($KUBECTL -n default get service kubernetes -o jsonpath='{.spec.clusterIP}')
web_ip=$($KUBECTL -n default get service web-svc -o jsonpath='{.spec.clusterIP}')
envlog=$($KUBECTL logs envy 2>&1) || fail "kubectl logs envy: $envlog"
[ "$envlog" = "G=hello T=s3cr3t S=s3cr3t M=hello K=$kube_ip:443 W=$web_ip:80" ] ||
    fail "pod envy printed '$envlog' (kubernetes service at $kube_ip:443, web-svc at $web_ip:80)"
within 15 sh -c "$KUBECTL get events --field-selector reason=InvalidEnvironmentVariableNames,involvedObject.name=envy -o name | grep -q ." ||
    fail "no InvalidEnvironmentVariableNames event for pod envy"
$KUBECTL delete pod envy --wait=false >/dev/null
ok "pod envy reads env from configmap and secret (envFrom, prefix, configMapKeyRef, secretKeyRef), KUBERNETES_SERVICE_HOST=$kube_ip and WEB_SVC_SERVICE_HOST=$web_ip; InvalidEnvironmentVariableNames event"

# 2e. A ConfigMap volume follows an edit within seconds: the object is
# watched (on the watch-mux thread, over TLS, as the Node authorizer allows
# a node to watch one name), not read again at the next periodic sync.
$KUBECTL -n default create configmap vol-config --from-literal=key=one >/dev/null ||
    fail "cannot create configmap vol-config"
$KUBECTL -n default create secret generic vol-secret --from-literal=key=one >/dev/null ||
    fail "cannot create secret vol-secret"
pod vol 'sleep 3600' 0 |
    sed 's/^  containers:/  volumes:\
  - name: cfg\
    configMap: {name: vol-config}\
  - name: sec\
    secret: {secretName: vol-secret}\
  containers:/' | $KUBECTL apply -f - >/dev/null || fail "cannot create pod vol"
within 30 $KUBECTL wait --for=condition=Ready pod/vol --timeout=2s || fail "pod vol not Ready"
vol_uid=$($KUBECTL get pod vol -o jsonpath='{.metadata.uid}')
vol_file=$work/root/pods/$vol_uid/volumes/kubernetes.io~configmap/cfg/key
sec_file=$work/root/pods/$vol_uid/volumes/kubernetes.io~secret/sec/key
[ "$(cat "$vol_file" 2>/dev/null)" = one ] || fail "$vol_file does not hold 'one'"
[ "$(cat "$sec_file" 2>/dev/null)" = one ] || fail "$sec_file does not hold 'one'"
$KUBECTL -n default patch configmap vol-config -p '{"data":{"key":"two"}}' >/dev/null ||
    fail "cannot edit configmap vol-config"
$KUBECTL -n default patch secret vol-secret -p '{"stringData":{"key":"two"}}' >/dev/null ||
    fail "cannot edit secret vol-secret"
edited=$SECONDS
within 15 sh -c "[ \"\$(cat '$vol_file')\" = two ]" || fail "$vol_file still holds '$(cat "$vol_file")' 15 s after the edit"
within 15 sh -c "[ \"\$(cat '$sec_file')\" = two ]" || fail "$sec_file still holds '$(cat "$sec_file")' 15 s after the edit"
took=$((SECONDS - edited))
grep -q "secret default/vol-secret changed" "$work/tinylet.log" ||
    fail "no watch event for secret vol-secret in tinylet's log"
muxes=$(cat /proc/"$tinylet_pid"/task/*/comm 2>/dev/null | grep -c '^watch-mux$' || true)
[ "$muxes" = 1 ] || fail "$muxes watch-mux threads"
$KUBECTL delete pod vol --wait=false >/dev/null
ok "configmap and secret volumes of pod vol followed an edit in ${took}s (watched, one watch-mux thread)"

# 2f. The node API's own authentication and authorization of a user's
# bearer token, straight to port 10250: TokenReview says who it is, and a
# SubjectAccessReview per request what it may do (nodes/proxy: get for a
# log, create for exec). A token of no one is 401, never anonymous.
$KUBECTL -n default create serviceaccount log-reader >/dev/null || fail "cannot create serviceaccount log-reader"
$KUBECTL -n default create serviceaccount nobody >/dev/null || fail "cannot create serviceaccount nobody"
$KUBECTL create clusterrole node-log-reader --verb=get --resource=nodes/proxy >/dev/null ||
    fail "cannot create clusterrole node-log-reader"
$KUBECTL create clusterrolebinding node-log-reader --clusterrole=node-log-reader \
    --serviceaccount=default:log-reader >/dev/null || fail "cannot bind node-log-reader"
sa_token() {
    local secret
    secret=$($KUBECTL -n default get serviceaccount "$1" -o jsonpath='{.secrets[0].name}') && [ -n "$secret" ] &&
        $KUBECTL -n default get secret "$secret" -o jsonpath='{.data.token}' | base64 -d
}
within 30 sa_token log-reader || fail "no token for serviceaccount log-reader"
within 30 sa_token nobody || fail "no token for serviceaccount nobody"
reader_tok=$(sa_token log-reader)
nobody_tok=$(sa_token nobody)
pod chatty 'echo chatty-line; sleep 3600' 0 | $KUBECTL apply -f - >/dev/null || fail "cannot create pod chatty"
within 30 $KUBECTL wait --for=condition=Ready pod/chatty --timeout=2s || fail "pod chatty not Ready"
node_api() { # TOKEN METHOD PATH -> "BODY CODE"
    curl -sk -X "$2" -H "Authorization: Bearer $1" -w ' %{http_code}' "https://127.0.0.1:10250$3" 2>&1
}
readlog() { [[ $(node_api "$reader_tok" GET /containerLogs/default/chatty/app) == *"chatty-line"*" 200" ]]; }
within 10 readlog || fail "log-reader's token cannot read pod chatty's log: $(node_api "$reader_tok" GET /containerLogs/default/chatty/app)"
exec_as_reader=$(node_api "$reader_tok" POST '/exec/default/chatty/app?command=true&stdout=true')
[[ $exec_as_reader == *" 403" ]] || fail "log-reader (get nodes/proxy only) exec'd into chatty: '$exec_as_reader', not 403"
as_nobody=$(node_api "$nobody_tok" GET /containerLogs/default/chatty/app)
[[ $as_nobody == *" 403" ]] || fail "serviceaccount nobody read chatty's log: '$as_nobody', not 403"
bogus=$(node_api "not-a-token" GET /containerLogs/default/chatty/app)
[[ $bogus == *" 401" ]] || fail "a made-up token read chatty's log: '$bogus', not 401"
$KUBECTL delete pod chatty --wait=false >/dev/null
ok "node API with a user's token: TokenReview and SubjectAccessReview (log 200 with get nodes/proxy, exec 403 without create, 403 without a role, 401 for a made-up token)"

# 2g. A missing ConfigMap key holds the container in
# CreateContainerConfigError; once the ConfigMap exists it starts.
pod held 'echo LATE=$LATE; sleep 3600' 0 |
    sed 's/^    command:/    env:\
    - name: LATE\
      valueFrom: {configMapKeyRef: {name: late-config, key: value}}\
    command:/' | $KUBECTL apply -f - >/dev/null || fail "cannot create pod held"
held_reason() { [ "$($KUBECTL get pod held -o jsonpath='{.status.containerStatuses[0].state.waiting.reason}')" = CreateContainerConfigError ]; }
within 30 held_reason || fail "pod held is not waiting with CreateContainerConfigError: $($KUBECTL get pod held -o jsonpath='{.status.containerStatuses}')"
$KUBECTL -n default create configmap late-config --from-literal=value=arrived >/dev/null ||
    fail "cannot create configmap late-config"
within 60 $KUBECTL wait --for=condition=Ready pod/held --timeout=2s || fail "pod held did not start once late-config existed"
heldlog() { [ "$($KUBECTL logs held 2>&1)" = LATE=arrived ]; }
within 10 heldlog || fail "pod held printed '$($KUBECTL logs held 2>&1)'"
$KUBECTL delete pod held --wait=false >/dev/null
ok "pod held waited in CreateContainerConfigError until configmap late-config existed, then started with LATE=arrived"

# 2h. activeDeadlineSeconds: the pod is stopped and Failed/DeadlineExceeded.
pod deadline 'sleep 3600' 0 | sed 's/^  containers:/  activeDeadlineSeconds: 5\
  containers:/' | $KUBECTL apply -f - >/dev/null || fail "cannot create pod deadline"
deadline_failed() {
    [ "$($KUBECTL get pod deadline -o jsonpath='{.status.phase}/{.status.reason}')" = Failed/DeadlineExceeded ]
}
within 40 deadline_failed || fail "pod deadline is '$($KUBECTL get pod deadline -o jsonpath='{.status.phase}/{.status.reason}')', not Failed/DeadlineExceeded"
deadline_stopped() {
    local id
    for id in $(ctr -a "$ctd/containerd.sock" -n k8s.io containers ls -q \
        'labels."io.kubernetes.pod.name"==deadline,labels."io.cri-containerd.kind"==container'); do
        ctr -a "$ctd/containerd.sock" -n k8s.io tasks ls |
            awk -v id="$id" '$1 == id && $3 == "RUNNING" {f = 1} END {exit f}' || return 1
    done
}
within 15 deadline_stopped || fail "pod deadline's container still runs"
$KUBECTL delete pod deadline --wait=false >/dev/null
ok "activeDeadlineSeconds 5: pod deadline Failed/DeadlineExceeded, its container stopped"

# 2i. A readiness gate holds Ready until a controller (here: admin, on the
# status subresource) sets its condition True; the node keeps that
# condition when it writes the pod's status.
pod gated 'sleep 3600' 0 | sed 's/^  containers:/  readinessGates:\
  - conditionType: example.com\/ready\
  containers:/' | $KUBECTL apply -f - >/dev/null || fail "cannot create pod gated"
within 30 $KUBECTL wait --for=condition=ContainersReady pod/gated --timeout=2s || fail "pod gated's containers not ready"
sleep 3
ready=$($KUBECTL get pod gated -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')
[ "$ready" = False ] || fail "pod gated is Ready=$ready with its gate unset"
out=$(admin_curl -X PATCH -H 'Content-Type: application/strategic-merge-patch+json' \
    -d '{"status":{"conditions":[{"type":"example.com/ready","status":"True"}]}}' \
    https://127.0.0.1:6443/api/v1/namespaces/default/pods/gated/status) || fail "cannot set pod gated's condition: $out"
within 20 $KUBECTL wait --for=condition=Ready pod/gated --timeout=2s || fail "pod gated not Ready after its gate was set"
gate=$($KUBECTL get pod gated -o jsonpath='{.status.conditions[?(@.type=="example.com/ready")].status}')
[ "$gate" = True ] || fail "the node's status write lost pod gated's example.com/ready condition ($gate)"
$KUBECTL delete pod gated --wait=false >/dev/null
ok "readiness gate example.com/ready held pod gated not Ready until set; then Ready, the condition kept"

# 2j. An ephemeral container added with kubectl debug runs once in the pod.
pod target 'sleep 3600' 0 | $KUBECTL apply -f - >/dev/null || fail "cannot create pod target"
within 30 $KUBECTL wait --for=condition=Ready pod/target --timeout=2s || fail "pod target not Ready"
out=$($KUBECTL debug target --image="$image" --container=dbg -- sh -c 'echo from-debug' 2>&1) ||
    fail "kubectl debug target: $out"
dbg_done() {
    [ "$($KUBECTL get pod target -o jsonpath='{.status.ephemeralContainerStatuses[0].state.terminated.exitCode}')" = 0 ]
}
within 30 dbg_done || fail "ephemeral container dbg did not run to exit 0: $($KUBECTL get pod target -o jsonpath='{.status.ephemeralContainerStatuses}')"
dbglog() { [ "$($KUBECTL logs target -c dbg 2>&1)" = from-debug ]; }
within 10 dbglog || fail "kubectl logs target -c dbg: '$($KUBECTL logs target -c dbg 2>&1)'"
sleep 3
restarts=$($KUBECTL get pod target -o jsonpath='{.status.ephemeralContainerStatuses[0].restartCount}')
[ "${restarts:-0}" = 0 ] || fail "ephemeral container dbg was restarted ($restarts)"
$KUBECTL delete pod target --wait=false >/dev/null
ok "kubectl debug: ephemeral container dbg ran once in pod target (exit 0, its log through kubectl logs)"

# 2k. A pod over its emptyDir's sizeLimit is evicted: Failed, reason
# Evicted, its container stopped.
pod hog 'dd if=/dev/zero of=/scratch/fill bs=1M count=4 2>/dev/null; sleep 3600' 0 |
    sed 's/^  containers:/  volumes:\
  - name: scratch\
    emptyDir: {sizeLimit: 1Mi}\
  containers:/; s/^    command:/    volumeMounts: [{name: scratch, mountPath: \/scratch}]\
    command:/' | $KUBECTL apply -f - >/dev/null || fail "cannot create pod hog"
hog_evicted() { [ "$($KUBECTL get pod hog -o jsonpath='{.status.phase}/{.status.reason}')" = Failed/Evicted ]; }
within 60 hog_evicted || fail "pod hog is '$($KUBECTL get pod hog -o jsonpath='{.status.phase}/{.status.reason}')', not Failed/Evicted"
hog_msg=$($KUBECTL get pod hog -o jsonpath='{.status.message}')
events=$($KUBECTL get events --field-selector involvedObject.name=hog -o jsonpath='{.items[*].reason}')
[[ $events == *Evicted* ]] || fail "no Evicted event for pod hog: $events"
$KUBECTL delete pod hog --wait=false >/dev/null
ok "pod hog over its emptyDir sizeLimit: Failed/Evicted ($hog_msg)"

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
with_ephemeral_containers
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

# 8. The Get and Cache strategies (tinylet restarted with each): a Secret
# volume still follows an edit, read again at the pod's periodic sync.
strategy_case() { # STRATEGY N
    printf 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nconfigMapAndSecretChangeDetectionStrategy: %s\nsyncFrequency: 5s\n' \
        "$1" >"$work/strategy.yaml"
    stop_tinylet
    start_tinylet --config "$work/strategy.yaml"
    within 30 $KUBECTL wait --for=condition=Ready node/edge-1 --timeout=2s || fail "node not Ready with strategy $1"
    $KUBECTL -n default create secret generic "poll-$2" --from-literal=key=one >/dev/null ||
        fail "cannot create secret poll-$2"
    pod "poll-$2" 'sleep 3600' 0 | sed "s/^  containers:/  volumes:\\
  - name: sec\\
    secret: {secretName: poll-$2}\\
  containers:/" | $KUBECTL apply -f - >/dev/null || fail "cannot create pod poll-$2"
    within 30 $KUBECTL wait --for=condition=Ready "pod/poll-$2" --timeout=2s || fail "pod poll-$2 not Ready ($1)"
    local uid file
    uid=$($KUBECTL get pod "poll-$2" -o jsonpath='{.metadata.uid}')
    file=$work/root/pods/$uid/volumes/kubernetes.io~secret/sec/key
    [ "$(cat "$file" 2>/dev/null)" = one ] || fail "$file does not hold 'one' ($1)"
    # Past the syncs that follow the start (the containers' PLEG events):
    # the edit must come with a periodic one.
    sleep 3
    $KUBECTL -n default patch secret "poll-$2" -p '{"stringData":{"key":"two"}}' >/dev/null ||
        fail "cannot edit secret poll-$2"
    local edited=$SECONDS
    within 30 sh -c "[ \"\$(cat '$file')\" = two ]" || fail "$file still holds '$(cat "$file")' 30 s after the edit ($1, syncFrequency 5s)"
    local took=$((SECONDS - edited))
    # Read again at the pod's sync, not pushed by a watch.
    ! grep -q "secret default/poll-$2 changed" "$work/tinylet.log" ||
        fail "secret poll-$2 was watched under strategy $1"
    $KUBECTL delete pod "poll-$2" --wait=false >/dev/null
    ok "strategy $1 (syncFrequency 5s): secret volume of pod poll-$2 followed an edit in ${took}s, read again at the pod's sync (no watch)"
}
strategy_case Get 1
strategy_case Cache 2

echo "real-apiserver: $passed passed, 0 failed"
