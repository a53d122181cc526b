#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The relay's systemd unit: `make install` (with debian/rules' paths) stages
# it, systemd-analyze finds nothing wrong in it, it comes after the daemon's
# unit and needs it, restarts the relay on a crash, and its ExecStart line,
# run as written (paths under the staging root), starts a relay that serves
# its socket beside a real daemon's. Not under a real systemd: tests/systemd
# boots one. Prints PASS/FAIL per case.
#   sh tests/relay/test_unit.sh BUILD_DIR   (from the top of the tree)
set -u
build=${1:-${SHMB_BUILD_DIR:-build}}
daemon=${SHMBROKERD:-$build/shmbrokerd}
fail=0
tmp=$(mktemp -d /tmp/shmb-relay-unit-XXXXXX)
dpid=
rpid=
cleanup() {
    [ -n "$rpid" ] && kill "$rpid" 2>/dev/null
    [ -n "$dpid" ] && kill "$dpid" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
check() { # name ok-status why
    if [ "$2" -eq 0 ]; then echo "PASS: $1"; else echo "FAIL: $1: $3"; fail=1; fi
}

root=$tmp/root
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory BUILD="$build" \
    DESTDIR="$root" PREFIX=/usr SYSCONFDIR=/etc UNITDIR=/lib/systemd/system \
    PYTHONDIR=/usr/lib/python3/dist-packages install > "$tmp/install.log" 2>&1
check "make install stages the relay's unit and its settings file" \
    "$( [ -f "$root/lib/systemd/system/shmbroker-relay.service" ] &&
        [ -f "$root/etc/default/shmbroker-relay" ]; echo $?)" \
    "$(tail -5 "$tmp/install.log")"
unit=$root/lib/systemd/system/shmbroker-relay.service
[ -f "$unit" ] || exit 1

field() { sed -n "s/^$1=//p" "$unit"; }
ok=1; echo " $(field Requires) " | grep -q ' shmbrokerd.service ' && \
    echo " $(field After) " | grep -q ' shmbrokerd.service ' && ok=0
check "the unit needs the daemon's and starts after it" $ok \
    "Requires=$(field Requires) After=$(field After)"
ok=1; [ "$(field Restart)" = on-failure ] && ok=0
check "a crashed relay is restarted (Restart=on-failure)" $ok "Restart=$(field Restart)"
ok=1; grep -q '@' "$unit" || ok=0
check "every @NAME@ of the template was substituted" $ok "$(grep '@' "$unit")"

if command -v systemd-analyze > /dev/null && [ -f /lib/systemd/system/sysinit.target ]; then
    # The host's targets, which the unit's dependencies reach, beside it.
    cp -n /lib/systemd/system/*.target "$root/lib/systemd/system/" 2>/dev/null
    out=$(systemd-analyze verify --man=no --root="$root" \
          /lib/systemd/system/shmbroker-relay.service 2>&1 | grep -v 'shmbrokerd')
    ok=1; [ -z "$out" ] && ok=0
    check "systemd-analyze verify finds nothing wrong in the unit" $ok "$out"
else
    echo "SKIP: systemd-analyze verify (no systemd-analyze or no systemd targets on this host)"
fi

# ExecStart as written: the binary and the key file under the staging root,
# SHMBROKER_RELAY_OPTS empty, the daemon's socket given by the environment.
cmd=$(field ExecStart | sed -e 's/\$SHMBROKER_RELAY_OPTS//' -e "s| /| $root/|g" -e "s|^/|$root/|")
key=$(echo "$cmd" | sed -n 's/.*--key-file \([^ ]*\).*/\1/p')
ok=1; [ -n "$key" ] && case "$key" in "$root"/etc/shmbroker/*) ok=0 ;; esac
check "ExecStart names the key file under /etc/shmbroker" $ok "ExecStart=$(field ExecStart)"
cond=$(field ConditionPathExists)
ok=1; [ "$root$cond" = "$key" ] && ok=0
check "the unit starts only once that key file exists" $ok "ConditionPathExists=$cond, key $key"
mkdir -p "$(dirname "$key")"
head -c 32 /dev/urandom | base64 > "$key"
chmod 600 "$key"
sock=$tmp/d.sock
"$daemon" --socket "$sock" --size 64M --name "unit$$" --fresh > /dev/null 2> "$tmp/daemon.log" &
dpid=$!
i=0
while [ ! -S "$sock" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
SHMBROKER_SOCKET=$sock UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n $cmd 2> "$tmp/relay.log" &
rpid=$!
i=0
reply=
while [ $i -lt 200 ]; do
    reply=$(printf '{"op":"status"}\n' | timeout 5 python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.stdin.buffer.read())
print(s.makefile("rb").readline().decode(), end="")' "$sock.relay" 2>/dev/null) && break
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.1
    i=$((i + 1))
done
ok=1; echo "$reply" | grep -q '"ok": *true' && ok=0
check "the relay started by the unit's ExecStart serves its socket beside the daemon's" $ok \
    "reply '$reply'; relay log: $(tail -3 "$tmp/relay.log")"
exit $fail
