#!/usr/bin/env bash
# Builds the two local test images as OCI image-layout tarballs, without any
# network: one uncompressed layer holding the static busybox from Debian's
# busybox-static package and a symlink per applet.
#
#   docker.io/tinylet/busybox:1  Cmd ["sh"]
#   docker.io/tinylet/pause:1    sleeps until SIGTERM/SIGINT (the sandbox image)
#
# Usage: oci-image.sh OUTDIR
#   writes OUTDIR/tinylet-busybox-1.tar and OUTDIR/tinylet-pause-1.tar and
#   prints their paths. Both import with `ctr -n k8s.io images import FILE`.
# Usage: oci-image.sh OUTDIR NAME
#   writes one more image NAME (e.g. docker.io/tinylet/spare:1), the busybox
#   layer with its own config (Cmd ["true"] and a label naming it), so it has
#   an image ID of its own; prints its path.
#   The output is byte-for-byte reproducible for a given busybox binary
#   (fixed mtimes, owners and ordering); existing tarballs newer than both
#   this script and the busybox binary are reused.
#
# Environment: BUSYBOX (default /bin/busybox).
set -euo pipefail

BUSYBOX=${BUSYBOX:-/bin/busybox}
out=${1:?usage: oci-image.sh OUTDIR [NAME]}
extra=${2:-}

busybox_tar="$out/tinylet-busybox-1.tar"
pause_tar="$out/tinylet-pause-1.tar"

die() { echo "oci-image.sh: $*" >&2; exit 1; }

[ -x "$BUSYBOX" ] || die "$BUSYBOX not found: install the busybox-static package (apt-get install busybox-static)"
"$BUSYBOX" --list >/dev/null 2>&1 || die "$BUSYBOX does not run as busybox (--list failed)"
for tool in tar sha256sum stat; do
    command -v "$tool" >/dev/null || die "$tool is required"
done

# Reuse the cache when it is newer than its inputs.
up_to_date() {
    local f=$1
    [ -s "$f" ] && [ "$f" -nt "$BUSYBOX" ] && [ "$f" -nt "${BASH_SOURCE[0]}" ]
}
if [ -z "$extra" ] && up_to_date "$busybox_tar" && up_to_date "$pause_tar"; then
    printf '%s\n%s\n' "$busybox_tar" "$pause_tar"
    exit 0
fi

mkdir -p "$out"
work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A fixed timestamp for every file, so that the digests are reproducible.
EPOCH=0
CREATED="1970-01-01T00:00:00Z"
PATH_ENV="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Deterministic tar of the current directory's entries given as arguments.
det_tar() {
    local dest=$1
    shift
    tar --create --file "$dest" --format=gnu --sort=name \
        --mtime="@$EPOCH" --owner=0 --group=0 --numeric-owner \
        --no-acls --no-xattrs --no-selinux "$@"
}

sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

# ---- the root filesystem layer -------------------------------------------
umask 022
rootfs="$work/rootfs"
mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,root,tmp,var,proc,sys,dev}
chmod 1777 "$rootfs/tmp"
chmod 700 "$rootfs/root"
install -m 0755 "$BUSYBOX" "$rootfs/bin/busybox"
while IFS= read -r applet; do
    case "$applet" in
    busybox | "" | */*) continue ;;
    esac
    ln -s busybox "$rootfs/bin/$applet"
done < <("$BUSYBOX" --list)
[ -L "$rootfs/bin/sh" ] || die "$BUSYBOX has no sh applet"
[ -L "$rootfs/bin/sleep" ] || die "$BUSYBOX has no sleep applet"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"

blobs="$work/blobs"
mkdir -p "$blobs"
(cd "$rootfs" && det_tar "$blobs/layer.tar" .)
layer_digest=$(sha "$blobs/layer.tar")
layer_size=$(size "$blobs/layer.tar")

# ---- one image: config, manifest, index, oci-layout, all in one tarball ---
# make_image NAME TARBALL PROCESS_JSON
#   PROCESS_JSON: the "Entrypoint"/"Cmd" members of the image config.
make_image() {
    local name=$1 dest=$2 process=$3
    local layout="$work/layout-${name//[^a-z0-9]/_}"
    mkdir -p "$layout/blobs/sha256"
    cp "$blobs/layer.tar" "$layout/blobs/sha256/$layer_digest"

    local config="$work/config.json"
    printf '%s' "{\"architecture\":\"amd64\",\"os\":\"linux\",\"created\":\"$CREATED\",\"config\":{\"Env\":[\"$PATH_ENV\"],$process,\"WorkingDir\":\"/\"},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer_digest\"]},\"history\":[{\"created\":\"$CREATED\",\"created_by\":\"tinylet packaging/oci-image.sh: busybox-static\"}]}" >"$config"
    local config_digest config_size
    config_digest=$(sha "$config")
    config_size=$(size "$config")
    mv "$config" "$layout/blobs/sha256/$config_digest"

    local manifest="$work/manifest.json"
    printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$config_digest\",\"size\":$config_size},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$layer_digest\",\"size\":$layer_size}]}" >"$manifest"
    local manifest_digest manifest_size
    manifest_digest=$(sha "$manifest")
    manifest_size=$(size "$manifest")
    mv "$manifest" "$layout/blobs/sha256/$manifest_digest"

    local tag=${name##*:}
    printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$manifest_digest\",\"size\":$manifest_size,\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"$tag\"}}]}" >"$layout/index.json"
    printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
    chmod -R u=rwX,go=rX "$layout"

    # Built inside this run's work dir and renamed into place: concurrent
    # runs (parallel tests) never see or write a half-built tarball.
    local built
    built="$work/$(basename "$dest")"
    (cd "$layout" && det_tar "$built" oci-layout index.json blobs)
    mv "$built" "$dest"
}

if [ -n "$extra" ]; then
    extra_tar="$out/$(printf '%s' "$extra" | tr -c 'a-zA-Z0-9.-' '_').tar"
    make_image "$extra" "$extra_tar" "\"Cmd\":[\"true\"],\"Labels\":{\"name\":\"$extra\"}"
    printf '%s\n' "$extra_tar"
    exit 0
fi
make_image docker.io/tinylet/busybox:1 "$busybox_tar" '"Cmd":["sh"]'
# The sandbox ("pause") image: PID 1 of the pod, it only has to stay alive
# and leave promptly on SIGTERM/SIGINT. The sleep runs in the background so
# that the shell's traps fire while it waits.
make_image docker.io/tinylet/pause:1 "$pause_tar" \
    '"Entrypoint":["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 2147483647 & wait $!; done"]'

printf '%s\n%s\n' "$busybox_tar" "$pause_tar"
