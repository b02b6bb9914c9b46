#!/usr/bin/env bash
# Installs what building and testing tinylet needs on Debian (bookworm), as
# root. Idempotent: when everything is present it only checks, and it runs
# `apt-get update` only when a package is missing.
#
#   build:  cmake g++ make pkg-config (grpcio-sys builds gRPC's C core)
#   tests:  containerd runc containernetworking-plugins busybox-static
#           iproute2 iptables util-linux (a private containerd with CNI and
#           locally built busybox images; see containerd-private.sh);
#           procps (`kill`, which the tests use to signal tinylet);
#           openssl (certificates for the TLS tests of the API client and
#           the fake apiserver); docker-registry skopeo apache2-utils (a
#           private image registry with htpasswd auth for the image pull
#           tests; see tests/support/registry.rs); curl (an HTTP/2 client
#           other than tinylet's, for the fake apiserver's HTTP/2 tests)
# The Rust toolchain itself is expected from rustup.
set -euo pipefail

die() { echo "deps.sh: $*" >&2; exit 1; }

packages=(
    ca-certificates
    cmake g++ make pkg-config
    containerd runc containernetworking-plugins busybox-static
    iproute2 iptables util-linux procps tar coreutils openssl curl
    docker-registry skopeo apache2-utils
)

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
for p in "${packages[@]}"; do
    installed "$p" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing packages ${missing[*]}; run this script as root to install them"
    command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get: install them by hand"
    echo "deps.sh: installing ${missing[*]}" >&2
    # shellcheck source=packaging/apt-install.sh
    . "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh"
    apt_install deps.sh "${missing[@]}"
fi

# rustup installs into ~/.cargo/bin, which a non-login shell may not have.
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null ||
    die "cargo not found: install the Rust toolchain with rustup (https://rustup.rs) and put ~/.cargo/bin on PATH"

# grpcio-sys 0.13's C core builds with Debian 12's g++ 12 and Debian 13's
# g++ 14 (packaging/distro-test.sh builds and tests in a trixie root).
echo "deps.sh: dependencies present" >&2
