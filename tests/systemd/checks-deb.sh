#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The Debian packages under a real systemd: install, upgrade, remove and
# purge, as a Debian 12 operator would, inside the booted container that
# tests/systemd/run.sh prepares. The packages are in /debs/old and, with a
# higher version (tests/systemd/deb-bump.sh), in /debs/new. There is no
# network: apt-get installs the local files (as `apt install ./x.deb`),
# every dependency being in the root already, so it has nothing to fetch.
# (With --no-download, bookworm's apt 2.6 refuses local files: "Internal
# Error, Pathname to install is not absolute".) libshmbroker-dev is not installed
# (it needs libjansson-dev, which the root does not have); its contents are
# checked instead.
. "$(dirname "$0")/lib-in.sh"

old=/debs/old
new=/debs/new
sock=/run/shmbroker/shmbroker.sock
segment=/dev/shm/shmbroker
apt_log=/tmp/checks-deb-apt.log

# apt_get ARG...: apt-get without questions; its output goes to
# $apt_log, whose end is shown when it fails.
apt_get() {
    if DEBIAN_FRONTEND=noninteractive apt-get -y -q "$@" >"$apt_log" 2>&1; then
        return 0
    fi
    tail -n 15 "$apt_log" | sed 's/^/  | /'
    return 1
}

# The packages a user installs, from DIR.
user_debs() {
    echo "$1"/shmbroker_*.deb "$1"/libshmbroker1_*.deb "$1"/python3-shmbroker_*.deb
}

# dpkg's conffiles of shmbroker include both settings files.
has_conffiles() {
    lib_c=$(dpkg-query -W -f='${Conffiles}\n' shmbroker) || return 1
    echo "$lib_c" | grep -q "^ /etc/shmbrokerd.conf " &&
        echo "$lib_c" | grep -q "^ /etc/default/shmbrokerd "
}

# libshmbroker-dev in DIR has the header, the .so link, the static library
# and the pkg-config file.
dev_package_complete() {
    lib_c=$(dpkg-deb -c "$1"/libshmbroker-dev_*.deb) || return 1
    for f in include/shmbroker.h "libshmbroker.so -> libshmbroker.so.1" libshmbroker.a \
        pkgconfig/shmbroker.pc; do
        echo "$lib_c" | grep -qF "$f" || return 1
    done
}

# Succeed when the socket listens (active, its file there) and has been
# since the monotonic time SINCE, if given.
socket_listening() {
    systemctl is-active --quiet shmbrokerd.socket && [ -S "$sock" ] &&
        { [ -z "${1:-}" ] || unit_is shmbrokerd.socket ActiveEnterTimestampMonotonic "$1"; }
}

# Succeed when the unit is not running (inactive, or unknown once removed).
not_active() {
    ! systemctl is-active --quiet "$1"
}

# new_process BEFORE AFTER: succeed when AFTER is a pid, and another one.
new_process() {
    [ "$2" != 0 ] && [ "$2" != "$1" ]
}

# Succeed when process PID runs the installed /usr/sbin/shmbrokerd (the
# same inode; a replaced binary shows as "(deleted)").
runs_installed_binary() {
    exe=$(readlink "/proc/$1/exe") || return 1
    [ "$exe" = /usr/sbin/shmbrokerd ] &&
        [ "$(stat -L -c %i "/proc/$1/exe")" = "$(stat -c %i /usr/sbin/shmbrokerd)" ]
}

# ---- install -----------------------------------------------------------------

# shellcheck disable=SC2046
if ! apt_get install $(user_debs "$old"); then
    fail "deb install" "apt-get install of the packages in $old failed"
    finish
fi
pass "deb install"

check "deb install: system user and group shmbroker" "no user or group shmbroker" \
    sh -c 'getent passwd shmbroker >/dev/null && getent group shmbroker >/dev/null'
check "deb install: socket enabled" \
    "shmbrokerd.socket is $(systemctl is-enabled shmbrokerd.socket 2>&1)" \
    unit_is shmbrokerd.socket UnitFileState enabled
check "deb install: socket listening" "shmbrokerd.socket not active or no $sock" \
    socket_listening
check "deb install: service not started by the package" \
    "shmbrokerd.service is $(systemctl is-active shmbrokerd.service)" \
    not_active shmbrokerd.service
check "deb install: service not enabled (the socket starts it)" \
    "shmbrokerd.service is $(systemctl is-enabled shmbrokerd.service 2>&1)" \
    unit_is shmbrokerd.service UnitFileState disabled
check "deb install: conffiles /etc/shmbrokerd.conf and /etc/default/shmbrokerd" \
    "dpkg lists: $(dpkg-query -W -f='${Conffiles}' shmbroker)" has_conffiles
check "deb install: libshmbroker.so.1 known to the dynamic linker" \
    "ldconfig -p has no libshmbroker.so.1" \
    sh -c 'ldconfig -p | grep -q "libshmbroker\.so\.1 "'
check "deb libshmbroker-dev: header, .so link, static library, pkg-config file" \
    "dpkg-deb -c shows: $(dpkg-deb -c "$old"/libshmbroker-dev_*.deb 2>&1 | awk '{print $6}' | tr '\n' ' ')" \
    dev_package_complete "$old"

if put_object deb-kept "committed before the upgrade"; then
    check "deb first client starts the service" "shmbrokerd.service is not active" \
        systemctl is-active --quiet shmbrokerd.service
else
    fail "deb first client starts the service" "shmbrokerctl put failed"
fi
check "deb python3-shmbroker: import shmbroker" "python3 cannot import it" \
    python3 -c 'import shmbroker'
got=$(timeout "$WAIT_SECONDS" python3 -c '
import shmbroker
with shmbroker.Client() as c:
    with c.get("deb-kept") as pin:
        print(bytes(pin.view).decode())' 2>&1)
check "deb python3-shmbroker: reads the object the ctl put" "python3 printed: $got" \
    [ "$got" = "committed before the upgrade" ]

# ---- upgrade -----------------------------------------------------------------

pid_before=$(daemon_pid)
socket_since=$(unit_prop shmbrokerd.socket ActiveEnterTimestampMonotonic)
# shellcheck disable=SC2046
if apt_get install $(user_debs "$new"); then
    pass "deb upgrade"
else
    fail "deb upgrade" "apt-get install of the packages in $new failed"
fi
version=$(dpkg-query -W -f='${Version}' shmbroker)
check "deb upgrade: the new version is installed" "shmbroker is at $version" \
    [ "${version%+test2}" != "$version" ]
check "deb upgrade: the socket kept listening, never stopped" \
    "socket active since $(unit_prop shmbrokerd.socket ActiveEnterTimestampMonotonic), was $socket_since" \
    socket_listening "$socket_since"
wait_for systemctl is-active --quiet shmbrokerd.service
pid_after=$(daemon_pid)
check "deb upgrade: the service was restarted" "main pid $pid_before before, $pid_after after" \
    new_process "$pid_before" "$pid_after"
check "deb upgrade: the running daemon is the upgraded binary" \
    "pid $pid_after runs $(readlink "/proc/$pid_after/exe" 2>&1)" \
    runs_installed_binary "$pid_after"
check "deb upgrade: committed objects kept" "deb-kept is gone or changed" \
    object_is deb-kept "committed before the upgrade"

# ---- remove ------------------------------------------------------------------

if apt_get remove shmbroker; then
    pass "deb remove"
else
    fail "deb remove" "apt-get remove shmbroker failed"
fi
check "deb remove: socket and service stopped" \
    "socket $(systemctl is-active shmbrokerd.socket), service $(systemctl is-active shmbrokerd.service)" \
    sh -c "! systemctl is-active --quiet shmbrokerd.socket &&
        ! systemctl is-active --quiet shmbrokerd.service && [ ! -e $sock ]"
check "deb remove: the segment is gone" "$segment is still there" \
    [ ! -e "$segment" ]
check "deb remove: the programs are gone" "/usr/sbin/shmbrokerd or /usr/bin/shmbrokerctl is left" \
    sh -c '[ ! -e /usr/sbin/shmbrokerd ] && [ ! -e /usr/bin/shmbrokerctl ]'
check "deb remove: the conffiles are kept" "/etc/shmbrokerd.conf or /etc/default/shmbrokerd is gone" \
    sh -c '[ -f /etc/shmbrokerd.conf ] && [ -f /etc/default/shmbrokerd ]'

# ---- purge -------------------------------------------------------------------

# What a stop can leave behind: the runtime directory (kept by
# RuntimeDirectoryPreserve=yes), and a segment if the daemon was killed in
# a way that kept it (made here, as the daemon's user would own it).
mkdir -p /run/shmbroker
install -o shmbroker -g shmbroker -m 0600 /dev/null "$segment"
if apt_get purge shmbroker; then
    pass "deb purge"
else
    fail "deb purge" "apt-get purge shmbroker failed"
fi
check "deb purge: the conffiles are removed" "/etc/shmbrokerd.conf or /etc/default/shmbrokerd is left" \
    sh -c '[ ! -e /etc/shmbrokerd.conf ] && [ ! -e /etc/default/shmbrokerd ]'
check "deb purge: the system user's files are removed" "/run/shmbroker or $segment is left" \
    sh -c "[ ! -e /run/shmbroker ] && [ ! -e $segment ]"
check "deb purge: the socket is no longer enabled" "sockets.target.wants still links it" \
    [ ! -e /etc/systemd/system/sockets.target.wants/shmbrokerd.socket ]
if getent passwd shmbroker >/dev/null; then
    note "the system user shmbroker stays after purge, as Debian leaves system users"
fi
if apt_get purge libshmbroker1 python3-shmbroker; then
    check "deb purge: the library and the Python package leave nothing" \
        "files left: $(ls -d /usr/lib/python3/dist-packages/shmbroker /usr/lib/*/libshmbroker* 2>/dev/null)" \
        sh -c '[ ! -e /usr/lib/python3/dist-packages/shmbroker ] &&
            ! ls /usr/lib/*/libshmbroker* >/dev/null 2>&1'
else
    fail "deb purge: the library and the Python package leave nothing" \
        "apt-get purge libshmbroker1 python3-shmbroker failed"
fi

finish
