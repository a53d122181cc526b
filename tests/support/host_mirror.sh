# SPDX-License-Identifier: Apache-2.0
# Sourced by the scripts that debootstrap a cached Debian root
# (tests/systemd/run.sh, tests/arm64/run.sh): the mirror to build it from.

# The Debian mirror this host's apt already uses (deb822 sources first).
host_mirror() {
    m=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n 1)
    [ -n "$m" ] || m=$(awk '$1 == "deb" && $2 !~ /security/ { print $2; exit }' \
        /etc/apt/sources.list 2>/dev/null)
    echo "$m"
}
