#!/usr/bin/env bash
# Builds tinylet's Debian package from an already built static binary, with
# dpkg-deb alone (no debhelper, no network).
#
#   build-deb.sh ARCH BINARY VERSION OUTDIR
#     ARCH     amd64 or arm64; BINARY must be a static ELF for it
#     VERSION  the package version, e.g. 0.1.0 (Cargo.toml's); it must be the
#              top entry of packaging/deb/changelog
#   writes OUTDIR/tinylet_<VERSION>_<ARCH>.deb and prints its path.
#
# The package version is VERSION as given, with no Debian revision: the
# packaging lives in tinylet's own tree and is released with it. A rebuild
# of the same release with packaging changes can pass e.g. 0.1.0-2 (after
# adding that entry to the changelog).
#
# Contents: /usr/bin/tinylet, /usr/lib/systemd/system/tinylet.service
# (packaging/systemd), the conffiles /etc/tinylet/config.yaml and
# /etc/default/tinylet, /etc/kubernetes/manifests/, the man page, the
# copyright, changelog, README.Debian and an example CNI configuration; the
# maintainer scripts are packaging/deb/{postinst,prerm,postrm}.
#
# Reproducible: every file's mtime is SOURCE_DATE_EPOCH (default: the date
# of the changelog's top entry), owners are root, gzip runs with -n, and
# dpkg-deb (which orders members and uses SOURCE_DATE_EPOCH itself) writes
# xz with one thread: the same inputs give the same bytes.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src="$here/deb"

die() { echo "build-deb.sh: $*" >&2; exit 1; }

[ $# = 4 ] || die "usage: build-deb.sh ARCH BINARY VERSION OUTDIR"
arch=$1 binary=$2 version=$3 outdir=$4

for tool in dpkg-deb gzip md5sum od find touch sort; do
    command -v "$tool" >/dev/null || die "$tool is required (dpkg, gzip, coreutils, findutils)"
done

case "$arch" in
amd64) want_machine=62 ;;  # EM_X86_64
arm64) want_machine=183 ;; # EM_AARCH64
*) die "ARCH must be amd64 or arm64, not '$arch'" ;;
esac

# Debian version syntax (an epoch would not fit the file name: none).
[[ "$version" =~ ^[0-9][A-Za-z0-9.+~]*(-[A-Za-z0-9.+~]+)?$ ]] ||
    die "VERSION '$version' is not a Debian version without epoch (e.g. 0.1.0 or 0.1.0-2)"

# ---- the binary: a static ELF for ARCH ------------------------------------
if [ ! -f "$binary" ] || [ ! -x "$binary" ]; then
    die "BINARY $binary is not an executable file"
fi
# Unsigned little-endian integer of $2 bytes at offset $1 of the binary.
elf_uint() {
    local v
    v=$(od -An -j "$1" -N "$2" -t "u$2" --endian=little "$binary" | tr -d ' ')
    [ -n "$v" ] || die "BINARY $binary: truncated ELF header"
    printf '%s\n' "$v"
}
[ "$(od -An -c -N 4 "$binary" | tr -d ' ')" = '177ELF' ] || die "BINARY $binary is not an ELF file"
[ "$(elf_uint 4 1)" = 2 ] || die "BINARY $binary is not a 64-bit ELF"
[ "$(elf_uint 5 1)" = 1 ] || die "BINARY $binary is not little-endian"
machine=$(elf_uint 18 2)
[ "$machine" = "$want_machine" ] ||
    die "BINARY $binary is for ELF machine $machine, not $arch ($want_machine)"
# Static: no program header of type PT_INTERP (3), so no dynamic loader and
# no shared libraries to depend on.
phoff=$(elf_uint 32 8)
phentsize=$(elf_uint 54 2)
phnum=$(elf_uint 56 2)
for ((i = 0; i < phnum; i++)); do
    [ "$(elf_uint $((phoff + i * phentsize)) 4)" != 3 ] ||
        die "BINARY $binary is dynamically linked (it has an interpreter); the package needs the static build"
done

# ---- the changelog names this version --------------------------------------
top=$(head -n 1 "$src/changelog")
[[ "$top" =~ ^tinylet\ \(([^\)]+)\) ]] || die "$src/changelog: first line is not 'tinylet (VERSION) ...'"
[ "${BASH_REMATCH[1]}" = "$version" ] ||
    die "VERSION $version is not the top entry of $src/changelog (${BASH_REMATCH[1]}): add an entry for it"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    trailer=$(grep -m 1 '^ -- ' "$src/changelog") || die "$src/changelog: no trailer line"
    SOURCE_DATE_EPOCH=$(date -d "${trailer##*>  }" +%s) ||
        die "$src/changelog: cannot read the date of '$trailer'"
fi
[[ "$SOURCE_DATE_EPOCH" =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH '$SOURCE_DATE_EPOCH' is not a number"
export SOURCE_DATE_EPOCH

# ---- stage the tree ---------------------------------------------------------
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
stage=$(mktemp -d "${TMPDIR:-/tmp}/tinylet-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root="$stage/tinylet"
umask 022

put() { # MODE SOURCE DEST
    install -D -m "$1" "$2" "$root/$3"
}
put 0755 "$binary" usr/bin/tinylet
put 0644 "$here/systemd/tinylet.service" usr/lib/systemd/system/tinylet.service
# tinylet as the kubelet, for kubeadm: its preflight runs `kubelet
# --version`, and it restarts kubelet.service. Not enabled by postinst.
ln -s tinylet "$root/usr/bin/kubelet"
put 0644 "$here/systemd/kubelet.service" usr/lib/systemd/system/kubelet.service
put 0644 "$src/config.yaml" etc/tinylet/config.yaml
put 0644 "$src/default" etc/default/tinylet
install -d -m 0755 "$root/etc/kubernetes/manifests"
doc=usr/share/doc/tinylet
put 0644 "$src/copyright" "$doc/copyright"
put 0644 "$src/README.Debian" "$doc/README.Debian"
put 0644 "$src/10-tinylet-bridge.conflist" "$doc/examples/10-tinylet-bridge.conflist"
# A version without a Debian revision is a native package's, whose changelog
# is changelog.gz; with a revision it is changelog.Debian.gz (Policy 12.7).
changelog_name=changelog.gz
[[ "$version" != *-* ]] || changelog_name=changelog.Debian.gz
gzip -9n <"$src/changelog" >"$stage/changelog.gz"
put 0644 "$stage/changelog.gz" "$doc/$changelog_name"
gzip -9n <"$src/tinylet.8" >"$stage/tinylet.8.gz"
put 0644 "$stage/tinylet.8.gz" usr/share/man/man8/tinylet.8.gz
ln -s tinylet.8.gz "$root/usr/share/man/man8/kubelet.8.gz"
put 0644 "$src/lintian-overrides" usr/share/lintian/overrides/tinylet

# Installed-Size as dpkg-gencontrol counts it: KiB per file, rounded up, and
# one per directory or symlink.
installed_size=$(cd "$root" && find . -mindepth 1 -printf '%y %s\n' |
    awk '$1 == "f" { n += int(($2 + 1023) / 1024); next } { n += 1 } END { print n }')

install -d -m 0755 "$root/DEBIAN"
cat >"$root/DEBIAN/control" <<EOF
Package: tinylet
Version: $version
Architecture: $arch
Maintainer: tinylet developers <dev@tinylet.invalid>
Installed-Size: $installed_size
Recommends: containerd, containernetworking-plugins
Provides: kubelet
Conflicts: kubelet
Replaces: kubelet
Section: admin
Priority: optional
Description: small Kubernetes node agent for edge machines
 tinylet does the job of the kubelet on small machines and appliances: it
 runs pods through containerd (or another CRI runtime) from static pod
 manifests, a URL, or the API server of a cluster it joins as a node.
 It is one static binary, synchronous, with a small memory footprint.
 .
 The package starts tinylet with systemd, configured for a standalone edge
 node: pods from the manifests in /etc/kubernetes/manifests, containerd at
 its usual socket. It also provides the kubelet command and a kubelet
 service for kubeadm join, in place of the upstream kubelet.
EOF
printf '%s\n' /etc/default/tinylet /etc/tinylet/config.yaml >"$root/DEBIAN/conffiles"
for script in postinst prerm postrm; do
    install -m 0755 "$src/$script" "$root/DEBIAN/$script"
done
# md5sums of every file but the conffiles (dpkg keeps their sums itself).
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -print | sed 's|^\./||' |
    grep -vxF -f <(sed 's|^/||' DEBIAN/conffiles) | LC_ALL=C sort |
    xargs -d '\n' md5sum) >"$stage/md5sums"
install -m 0644 "$stage/md5sums" "$root/DEBIAN/md5sums"

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

out="$outdir/tinylet_${version}_${arch}.deb"
threads=()
if dpkg-deb --help 2>/dev/null | grep -q -- '--threads-max'; then
    threads=(--threads-max=1)
fi
dpkg-deb --root-owner-group -Zxz -z9 "${threads[@]}" --build "$root" "$out" >/dev/null
printf '%s\n' "$out"
