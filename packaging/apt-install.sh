# Sourced by the packaging scripts that handle Debian packages:
#   apt_install PREFIX PKG...    (root; PREFIX names the caller in messages)
#     what deps.sh, build-aarch64.sh and deb-lint.sh install, in one way
#     that leaves the machine's services as they were;
#   debian_sources ROOT SUITE
#     an installed Debian's package sources in a debootstrapped root
#     (systemd-test.sh, distro-test.sh);
#   local_cas ROOT
#     the machine's own certificate authorities in that root.
#
# apt_install:
#
# - `--no-install-recommends`, and one retry after a fresh `apt-get update`
#   (two apt runs at once can delete each other's downloads).
# - With systemd as init, Debian starts a package's service as it installs
#   it (containerd.service, docker-registry.service): a policy-rc.d keeps
#   every service as it was for the length of the install.
# - Debian also enables what a package ships for the next boot (those
#   services; man-db.timer, which lintian's man-db brings): whatever unit
#   file this install enabled is disabled again, and named. The tests run
#   private instances of what they need; a user who wants the machine's
#   containerd runs `systemctl enable --now containerd`.

apt_install() {
    local prefix=$1
    shift
    [ $# -gt 0 ] || return 0
    export DEBIAN_FRONTEND=noninteractive
    local systemd=no ours=no before="" saved_trap=""
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        systemd=yes
        before=$(_apt_install_enabled)
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\n# apt-install.sh (tinylet): no service starts while it installs\nexit 101\n' \
                >/usr/sbin/policy-rc.d
            chmod 0755 /usr/sbin/policy-rc.d
            ours=yes
            # Gone again if the caller is killed mid-install.
            saved_trap=$(trap -p EXIT)
            trap 'rm -f /usr/sbin/policy-rc.d' EXIT
            echo "$prefix: systemd is the init: the installed packages' services are not started" >&2
        fi
    fi
    local rc=0
    apt-get update -qq || true
    if ! apt-get install -y -qq --no-install-recommends "$@" >/dev/null; then
        echo "$prefix: apt-get install failed; updating and retrying once" >&2
        sleep 5
        apt-get update -qq || true
        apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
    fi
    if [ $systemd = yes ]; then
        local unit
        for unit in $(comm -13 <(echo "$before") <(_apt_install_enabled)); do
            systemctl disable --quiet "$unit" 2>/dev/null || true
            echo "$prefix: $unit came with the install and is left disabled" >&2
        done
    fi
    if [ $ours = yes ]; then
        rm -f /usr/sbin/policy-rc.d
        trap - EXIT
        [ -z "$saved_trap" ] || eval "$saved_trap"
    fi
    return $rc
}

_apt_install_enabled() {
    systemctl list-unit-files --state=enabled --no-legend --plain 2>/dev/null | awk '{print $1}' | sort
}

# debian_sources ROOT SUITE: the package sources of a machine Debian's
# installer set up — the release, its updates and its security updates —
# in a root made by debootstrap (which writes only the first; Debian 12's
# Rust for other architectures, rustc-web, is current only in
# bookworm-security).
debian_sources() {
    local root=$1 suite=$2
    rm -f "$root/etc/apt/sources.list"
    mkdir -p "$root/etc/apt/sources.list.d"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: http://deb.debian.org/debian
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
}

# local_cas ROOT: the certificate authorities this machine added to its
# own (/usr/local/share/ca-certificates: a TLS proxy's in front of the
# registries, say), copied into a root made by debootstrap, as another
# machine on the same network would have them. `update-ca-certificates`
# in the root adds them to its bundle (the ca-certificates package runs it
# when it is installed).
local_cas() {
    local root=$1 crt
    mkdir -p "$root/usr/local/share/ca-certificates"
    for crt in /usr/local/share/ca-certificates/*.crt; do
        [ -f "$crt" ] && cp "$crt" "$root/usr/local/share/ca-certificates/"
    done
    return 0
}
