#!/usr/bin/env bash
# Checks tinylet's Debian packages as Debian would: lintian, and systemd's
# own parser on the unit the package ships.
#
#   deb-lint.sh DEB...
#
# - lintian (pedantic tags shown) must report no error and no warning. The
#   tags accepted are overridden, each with its reason, in
#   packaging/deb/lintian-overrides (installed as
#   /usr/share/lintian/overrides/tinylet, where lintian reads them). One
#   .deb serves Debian 12 and 13: bookworm's lintian wants the override of
#   package-supports-alternative-init-but-no-init.d-script (its units have
#   no init.d script), trixie's no longer has that tag and calls the
#   override an error (alien-tag). Where this lintian does not know the
#   tag, that alien-tag hint, and only that one, is not counted.
# - `systemd-analyze verify` must accept the packaged unit silently: it runs
#   on the package's tree (unpacked, with this machine's units beside it for
#   the targets it names) and checks the directives, ExecStart's binary and
#   the Documentation= man page. systemd-analyze only warns about a bad
#   directive, so any output at all fails the check.
#
# Installs lintian and systemd from Debian when missing (as root; apt-get
# update only then).
set -euo pipefail

die() { echo "deb-lint.sh: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: deb-lint.sh DEB..."
for deb in "$@"; do
    [ -f "$deb" ] || die "$deb: no such file"
done

missing=()
command -v lintian >/dev/null || missing+=(lintian)
command -v systemd-analyze >/dev/null || missing+=(systemd)
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing ${missing[*]}; run as root to install them"
    echo "deb-lint.sh: installing ${missing[*]}" >&2
    # shellcheck source=packaging/apt-install.sh
    . "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh"
    apt_install deb-lint.sh "${missing[@]}"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tinylet-deb-lint.XXXXXX")
trap 'rm -rf "$work"' EXIT

retired=package-supports-alternative-init-but-no-init.d-script
known_retired=yes
lintian-explain-tags "$retired" >/dev/null 2>&1 || known_retired=no

failed=0
for deb in "$@"; do
    echo "deb-lint.sh: lintian $deb" >&2
    # Errors and warnings fail (a new warning fails until fixed or
    # overridden); info and pedantic hints are shown.
    hints=$(lintian --display-info --pedantic --tag-display-limit 0 --fail-on none "$deb" 2> >(grep -v 'running with root privileges' >&2)) || {
        echo "deb-lint.sh: FAIL: lintian could not check $deb" >&2
        failed=1
    }
    printf '%s\n' "$hints" >&2
    bad=$(printf '%s\n' "$hints" | grep -E '^[EW]: ' || true)
    if [ $known_retired = no ] && printf '%s\n' "$bad" | grep -q -E "^E: [^ ]+: alien-tag $retired "; then
        echo "deb-lint.sh: not counted: alien-tag $retired (this lintian has no such tag; bookworm's needs the override)" >&2
        bad=$(printf '%s\n' "$bad" | grep -v -E "^E: [^ ]+: alien-tag $retired " || true)
    fi
    if [ -n "$bad" ]; then
        echo "deb-lint.sh: FAIL: lintian found errors or warnings in $deb" >&2
        failed=1
    fi

    echo "deb-lint.sh: systemd-analyze verify on the unit of $deb" >&2
    root="$work/$(basename "$deb" .deb)"
    mkdir -p "$root"
    dpkg-deb -x "$deb" "$root"
    for f in /usr/lib/systemd/system/* /lib/systemd/system/*; do
        [ -e "$root/usr/lib/systemd/system/${f##*/}" ] || cp -a "$f" "$root/usr/lib/systemd/system/"
    done
    for unit in usr/lib/systemd/system/tinylet.service usr/lib/systemd/system/kubelet.service; do
        [ -f "$root/$unit" ] || { echo "deb-lint.sh: FAIL: $deb has no /$unit" >&2; failed=1; continue; }
        rc=0
        out=$(MANPATH="$root/usr/share/man" systemd-analyze verify --root="$root" "/$unit" 2>&1) || rc=$?
        if [ $rc != 0 ] || [ -n "$out" ]; then
            printf '%s\n' "$out" >&2
            echo "deb-lint.sh: FAIL: systemd-analyze verify rejected /$unit of $deb (exit $rc)" >&2
            failed=1
        fi
    done
done

[ $failed = 0 ] || exit 1
echo "deb-lint.sh: $# package(s) clean: lintian (no errors or warnings), systemd-analyze verify" >&2
