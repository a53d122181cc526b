#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs inside the booted container after `make install PREFIX=/usr/local`:
# README's "Run under systemd", line by line as an operator types it, then
# what the units promise under a real systemd: notify readiness and status,
# reload through /etc/shmbrokerd.conf without procps, the watchdog, crashes,
# restart and stop keeping or freeing the store, group access, the hardening,
# and a start that cannot succeed. One PASS/FAIL/SKIP line per check.

. "$(dirname "$0")/lib-in.sh"

CONF=/etc/shmbrokerd.conf
SEG=/dev/shm/shmbroker
SOCK=/run/shmbroker/shmbroker.sock
# `systemd-analyze security shmbrokerd` as the units were measured on
# systemd 252 when these tests were written; hardening may only improve.
EXPOSURE_MAX=1.4
# A size no container's /dev/shm has room for (nspawn gives it 10% of RAM).
HUGE_SIZE=1T

# set_conf KEY VALUE: make /etc/shmbrokerd.conf say KEY = VALUE, replacing
# any earlier line for KEY. Written beside it and renamed over it, as the
# man page asks, so that a reload never reads half a file.
set_conf() {
    { grep -v "^[[:space:]]*$1[[:space:]]*=" "$CONF" 2>/dev/null; echo "$1 = $2"; } >"$CONF.new" &&
        mv "$CONF.new" "$CONF"
}

# The daemon's main pid changed from $1 to a running one.
restarted_from() {
    pid=$(daemon_pid)
    [ -n "$pid" ] && [ "$pid" != 0 ] && [ "$pid" != "$1" ] && unit_is shmbrokerd ActiveState active
}

# signal_daemon SIGNAL: send SIGNAL to shmbrokerd's main process; fail
# (sending nothing) when there is none: `kill -STOP 0` would stop this script.
signal_daemon() {
    pid=$(daemon_pid)
    [ -n "$pid" ] && [ "$pid" -gt 1 ] || return 1
    kill -"$1" "$pid"
}

# ---- README's steps ------------------------------------------------------------

# The steps the README lists after `make install` (which the host ran,
# staging into this root).
readme_steps() {
    if systemd-sysusers && getent passwd shmbroker >/dev/null && getent group shmbroker >/dev/null; then
        pass readme-sysusers
    else
        fail readme-sysusers "systemd-sysusers did not create the user and group shmbroker"
    fi
    systemctl daemon-reload || fail readme-daemon-reload "systemctl daemon-reload failed"
    if systemctl enable --now shmbrokerd.socket >/dev/null 2>&1 &&
        unit_is shmbrokerd.socket ActiveState active && [ -S "$SOCK" ] &&
        unit_is shmbrokerd.service ActiveState inactive; then
        pass readme-enable-socket
    else
        fail readme-enable-socket "the socket is not listening at $SOCK, or the service started early"
    fi
    # README: "systemctl start shmbrokerd  # or let the first client start it".
    if ctl status >/dev/null && unit_is shmbrokerd.service ActiveState active; then
        pass readme-first-client-starts-service
    else
        fail readme-first-client-starts-service "shmbrokerctl status failed or the service is $(unit_prop shmbrokerd ActiveState)"
    fi
    status=$(systemctl status shmbrokerd --no-pager 2>&1)
    if echo "$status" | grep -q 'Active: active (running)' &&
        echo "$status" | grep -q 'Status: "'; then
        pass readme-status-line
    else
        fail readme-status-line "no Status: line in systemctl status shmbrokerd"
    fi
}

# ---- readiness -----------------------------------------------------------------

# Type=notify: `systemctl start` returns once the daemon said READY=1 with
# its STATUS=, so right after it the status text is there and a client is
# served. A service declared started at exec would have neither yet.
check_readiness() {
    systemctl stop shmbrokerd 2>/dev/null # (its warning: the socket can still start it)
    if systemctl start shmbrokerd && unit_is shmbrokerd ActiveState active &&
        [ -n "$(unit_prop shmbrokerd StatusText)" ] && unit_is shmbrokerd Type notify &&
        ctl status >/dev/null; then
        pass notify-ready-before-active
    else
        fail notify-ready-before-active "Type=$(unit_prop shmbrokerd Type), after start: state $(unit_prop shmbrokerd ActiveState), status text '$(unit_prop shmbrokerd StatusText)'"
    fi
    # The daemon refreshes STATUS= with its occupancy.
    if wait_for sh -c 'systemctl show -p StatusText --value shmbrokerd | grep -q "used"'; then
        pass notify-status-occupancy
    else
        fail notify-status-occupancy "StatusText stays '$(unit_prop shmbrokerd StatusText)'"
    fi
}

# ---- reload ----------------------------------------------------------------------

# The documented route: edit /etc/shmbrokerd.conf, systemctl reload. It must
# work on a system without procps (no /bin/kill), as this minimal one.
check_reload() {
    if dpkg -S /bin/kill /usr/bin/kill 2>/dev/null | grep -q procps; then
        fail no-procps "procps is installed in this root: the reload checks would not show it is not needed"
    else
        pass no-procps
    fi
    if [ ! -f "$CONF" ]; then
        fail reload-applies-conf "$CONF was not installed"
        return
    fi
    pid=$(daemon_pid)
    set_conf max-clients 7
    journal_mark
    if ! out=$(systemctl reload shmbrokerd 2>&1); then
        fail reload-applies-conf "systemctl reload failed: $out $(journal_since_mark | grep -i -m 3 'fail\|error')"
    elif wait_for journal_has 'SIGHUP: settings reloaded \(.*max-clients 7[,)]' &&
        [ "$(daemon_pid)" = "$pid" ]; then
        pass reload-applies-conf
    else
        fail reload-applies-conf "no 'SIGHUP: settings reloaded (... max-clients 7 ...)' in the journal"
    fi
    check_broken_reload
}

# A file the daemon refuses: the reload fails with the reason in the journal,
# the daemon keeps running with the settings it had and keeps serving.
check_broken_reload() {
    cp "$CONF" "$CONF.good"
    put_object reload-key reload-value >/dev/null
    pid=$(daemon_pid)
    set_conf max-clients not-a-number
    journal_mark
    if systemctl reload shmbrokerd >/dev/null 2>&1; then
        fail reload-broken-conf-fails "systemctl reload succeeded with max-clients = not-a-number"
    elif ! wait_for journal_has 'max-clients|shmbrokerd\.conf'; then
        fail reload-broken-conf-fails "the journal does not name the bad setting: $(journal_since_mark | tail -n 3 | tr '\n' ' ')"
    elif [ "$(daemon_pid)" != "$pid" ] || ! object_is reload-key reload-value; then
        fail reload-broken-conf-fails "the daemon did not keep serving (pid $pid, now $(daemon_pid))"
    elif journal_has 'SIGHUP: settings (not )?reloaded'; then
        fail reload-broken-conf-fails "a SIGHUP reached the daemon although the file is broken"
    else
        pass reload-broken-conf-fails
    fi
    mv "$CONF.good" "$CONF"
}

# ---- crashes and restarts ---------------------------------------------------------

# The watchdog: a stopped daemon misses its pings, systemd kills it and
# starts another, which adopts the segment. A short WatchdogSec= for the test.
check_watchdog() {
    mkdir -p /etc/systemd/system/shmbrokerd.service.d
    printf '[Service]\nWatchdogSec=3s\n' >/etc/systemd/system/shmbrokerd.service.d/test-watchdog.conf
    systemctl daemon-reload
    systemctl restart shmbrokerd
    put_object watchdog-key watchdog-value >/dev/null
    pid=$(daemon_pid)
    journal_mark
    if ! signal_daemon STOP; then
        fail watchdog-restarts "shmbrokerd is not running (state $(unit_prop shmbrokerd ActiveState))"
    elif ! wait_for -t 60 restarted_from "$pid"; then
        fail watchdog-restarts "not restarted after SIGSTOP of pid $pid: state $(unit_prop shmbrokerd ActiveState)"
    elif ! journal_has 'atchdog timeout'; then
        fail watchdog-restarts "restarted, but the journal shows no watchdog timeout"
    elif ! object_is watchdog-key watchdog-value; then
        fail watchdog-restarts "restarted, but the committed object is gone"
    else
        pass watchdog-restarts
    fi
    rm /etc/systemd/system/shmbrokerd.service.d/test-watchdog.conf
    systemctl daemon-reload
    systemctl restart shmbrokerd
}

# kill -9, and a client that connects before the restart: it waits in the
# socket's backlog and is served by the next instance, which has the object.
check_kill9() {
    put_object kill-key kill-value >/dev/null
    pid=$(daemon_pid)
    if ! signal_daemon KILL; then
        fail kill9-client-served-after-restart "shmbrokerd is not running (state $(unit_prop shmbrokerd ActiveState))"
        return
    fi
    got=$(get_object kill-key 2>&1)
    if [ "$got" = kill-value ] && wait_for restarted_from "$pid"; then
        pass kill9-client-served-after-restart
    else
        fail kill9-client-served-after-restart "the client got '$got'; state $(unit_prop shmbrokerd ActiveState)"
    fi
}

# systemctl restart (a package upgrade does one) keeps committed objects.
check_restart_keeps() {
    put_object restart-key restart-value >/dev/null
    pid=$(daemon_pid)
    if ! systemctl restart shmbrokerd; then
        fail restart-keeps-objects "systemctl restart failed"
    elif [ "$(daemon_pid)" = "$pid" ]; then
        fail restart-keeps-objects "the main pid did not change"
    elif ! object_is restart-key restart-value; then
        fail restart-keeps-objects "restart-key is gone after systemctl restart"
    else
        pass restart-keeps-objects
    fi
}

# systemctl stop of the service alone: the segment stays, the next client
# starts it again and finds its objects.
check_stop_service_keeps() {
    put_object stop-key stop-value >/dev/null
    systemctl stop shmbrokerd 2>/dev/null # (its warning: the socket can still start it)
    if ! unit_is shmbrokerd ActiveState inactive; then
        fail stop-service-keeps-objects "the service is $(unit_prop shmbrokerd ActiveState) after stop"
    elif [ ! -e "$SEG" ]; then
        fail stop-service-keeps-objects "$SEG was removed by stopping the service alone"
    elif ! object_is stop-key stop-value; then
        fail stop-service-keeps-objects "the next client did not find stop-key"
    else
        pass stop-service-keeps-objects
    fi
}

# ---- access and hardening ------------------------------------------------------------

# Only members of the group shmbroker may connect.
check_groups() {
    useradd -M -s /bin/sh outsider 2>/dev/null
    useradd -M -s /bin/sh -G shmbroker worker 2>/dev/null
    put_object group-key group-value >/dev/null
    if as_user outsider timeout "$WAIT_SECONDS" shmbrokerctl status >/dev/null 2>&1; then
        fail group-outsider-refused "a user outside the group shmbroker was served"
    else
        pass group-outsider-refused
    fi
    got=$(as_user worker timeout "$WAIT_SECONDS" shmbrokerctl get group-key - 2>&1)
    if [ "$got" = group-value ]; then
        pass group-member-served
    else
        fail group-member-served "a member of shmbroker got: $got"
    fi
}

# PrivateDevices= gives the service its own /dev: its /dev/shm must still be
# the system's, or clients could not map what it creates.
check_dev_shm() {
    pid=$(daemon_pid)
    inside=$(stat -L -c %i "/proc/$pid/root$SEG" 2>/dev/null)
    outside=$(stat -c %i "$SEG" 2>/dev/null)
    if [ -n "$inside" ] && [ "$inside" = "$outside" ] &&
        [ "$(stat -c %U "$SEG")" = shmbroker ]; then
        pass dev-shm-shared-with-service
    else
        fail dev-shm-shared-with-service "segment inode in the service '$inside', in /dev/shm '$outside'"
    fi
    # The ceilings a container cannot show.
    limit=$(awk '/^Max open files/ { print $5 }' "/proc/$pid/limits")
    want=$(unit_prop shmbrokerd LimitNOFILE)
    if [ "$limit" = "$want" ]; then
        pass limit-nofile
    else
        skip limit-nofile "the unit asks $want but the container's PID 1 cannot raise RLIMIT_NOFILE above the host's ($limit)"
    fi
    skip cgroup-limits "a container's cgroup controllers are not delegated: resource limits are not enforced here"
}

# The unit's exposure score may only go down.
check_security() {
    score=$(systemd-analyze security shmbrokerd 2>/dev/null |
        sed -n 's/.*Overall exposure level for shmbrokerd.service: \([0-9.]*\).*/\1/p')
    if [ -z "$score" ]; then
        fail security-exposure "systemd-analyze security printed no exposure level"
    elif awk -v s="$score" -v m="$EXPOSURE_MAX" 'BEGIN { exit !(s <= m) }'; then
        pass security-exposure
    else
        fail security-exposure "exposure $score, above $EXPOSURE_MAX"
    fi
}

# ---- stopping, and a start that cannot succeed ----------------------------------

# Stopping the socket stops the service too and frees the segment.
check_stop_both_frees() {
    systemctl stop shmbrokerd.socket shmbrokerd
    if [ -e "$SEG" ]; then
        fail stop-socket-frees-segment "$SEG is still there"
    elif ! unit_is shmbrokerd ActiveState inactive; then
        fail stop-socket-frees-segment "the service is $(unit_prop shmbrokerd ActiveState)"
    else
        pass stop-socket-frees-segment
    fi
}

# Two pools, one a memfd: a memfd has no name in /dev/shm, so systemd's
# file-descriptor store keeps it. systemctl restart and a crash (kill -9,
# restarted by Restart=on-failure) both find its objects; the shm pool is
# adopted by name as ever. Stopping the socket frees both.
check_memfd_pool() {
    systemctl stop shmbrokerd.socket shmbrokerd
    cp "$CONF" "$CONF.good"
    printf 'pool = main:32M\npool = meta:8M,backing=memfd\n' >>"$CONF"
    systemctl start shmbrokerd.socket
    printf 'memfd-value' | ctl --pool meta put memfd-key - >/dev/null
    printf 'main-value' | ctl --pool main put main-key - >/dev/null
    if ! ctl --pool meta get memfd-key - >/dev/null 2>&1; then
        fail memfd-pool-served "a put to the memfd pool did not read back: $(ctl --pool meta get memfd-key - 2>&1)"
        mv "$CONF.good" "$CONF"
        return
    fi
    pass memfd-pool-served
    if [ -e /dev/shm/shmbroker.meta ] || [ ! -e /dev/shm/shmbroker.main ]; then
        fail memfd-pool-no-file "/dev/shm: $(ls /dev/shm | tr '\n' ' ')"
    else
        pass memfd-pool-no-file
    fi
    pid=$(daemon_pid)
    systemctl restart shmbrokerd
    if [ "$(daemon_pid)" != "$pid" ] && [ "$(ctl --pool meta get memfd-key - 2>&1)" = memfd-value ] &&
        [ "$(ctl --pool main get main-key - 2>&1)" = main-value ]; then
        pass memfd-pool-kept-across-restart
    else
        fail memfd-pool-kept-across-restart "after systemctl restart: meta '$(ctl --pool meta get memfd-key - 2>&1)', main '$(ctl --pool main get main-key - 2>&1)'"
    fi
    pid=$(daemon_pid)
    kill -9 "$pid"
    if wait_for -t 60 restarted_from "$pid" &&
        [ "$(ctl --pool meta get memfd-key - 2>&1)" = memfd-value ]; then
        pass memfd-pool-kept-across-crash
    else
        fail memfd-pool-kept-across-crash "after kill -9: state $(unit_prop shmbrokerd ActiveState), meta '$(ctl --pool meta get memfd-key - 2>&1)'"
    fi
    systemctl stop shmbrokerd.socket shmbrokerd
    if [ -e /dev/shm/shmbroker.main ]; then
        fail memfd-pool-stop-frees "/dev/shm/shmbroker.main is still there"
    else
        pass memfd-pool-stop-frees
    fi
    mv "$CONF.good" "$CONF"
    systemctl start shmbrokerd.socket
}

# Settings changed under a running daemon (its pools reordered and renamed
# in the file), then the socket stopped: the stop (ExecStopPost:
# --remove-segment, which reads the new file) removes the segments the
# daemon held, from the record it keeps beside its socket, and the record.
check_reorder_then_stop() {
    systemctl stop shmbrokerd.socket shmbrokerd
    cp "$CONF" "$CONF.good"
    printf 'pool = first:8M\npool = second:8M\n' >>"$CONF"
    systemctl start shmbrokerd.socket
    printf 'v' | ctl --pool first put k - >/dev/null
    cp "$CONF.good" "$CONF"
    printf 'pool = second:8M\npool = third:8M\n' >>"$CONF"
    systemctl stop shmbrokerd.socket shmbrokerd
    if [ -e /dev/shm/shmbroker.first ] || [ -e /dev/shm/shmbroker.second ] ||
        [ -e "$SOCK.segments" ]; then
        fail reorder-then-stop-frees "left: $(ls -a /dev/shm /run/shmbroker | tr '\n' ' ')"
    else
        pass reorder-then-stop-frees
    fi
    mv "$CONF.good" "$CONF"
    systemctl start shmbrokerd.socket
}

# size = 1T: the start fails for good. The service ends failed, not in a
# restart loop; the socket keeps listening; the client that was waiting is
# told why; systemctl status names the cause. Fixed, it starts again.
check_failed_start() {
    shm_kib=$(df -k /dev/shm | awk 'NR == 2 { print $2 }')
    if [ "$shm_kib" -ge 1073741824 ]; then
        skip failed-start "/dev/shm here is at least $HUGE_SIZE"
        return
    fi
    cp "$CONF" "$CONF.good"
    set_conf size "$HUGE_SIZE"
    systemctl reset-failed shmbrokerd 2>/dev/null
    systemctl start shmbrokerd.socket
    restarts=$(unit_prop shmbrokerd NRestarts)
    told=$(ctl status 2>&1)
    told_rc=$?
    wait_for unit_is shmbrokerd ActiveState failed
    sleep 3 # a restart loop (RestartSec=1s) would have moved on by now
    status=$(systemctl status shmbrokerd --no-pager -n 20 2>&1)
    if ! unit_is shmbrokerd ActiveState failed || ! unit_is shmbrokerd Result exit-code; then
        fail failed-start-service-failed "state $(unit_prop shmbrokerd ActiveState), result $(unit_prop shmbrokerd Result)"
    elif [ "$(unit_prop shmbrokerd NRestarts)" != "$restarts" ]; then
        fail failed-start-service-failed "restarted in a loop: NRestarts $restarts, then $(unit_prop shmbrokerd NRestarts)"
    else
        pass failed-start-service-failed
    fi
    if echo "$status" | grep -q 'Status: "failed to start' && echo "$status" | grep -qi 'space'; then
        pass failed-start-status-names-cause
    else
        fail failed-start-status-names-cause "systemctl status: $(echo "$status" | grep -i -m 2 'status:\|space' | tr '\n' ' ')"
    fi
    if unit_is shmbrokerd.socket ActiveState active && [ -S "$SOCK" ]; then
        pass failed-start-socket-listens
    else
        fail failed-start-socket-listens "socket $(unit_prop shmbrokerd.socket ActiveState)/$(unit_prop shmbrokerd.socket Result), $SOCK $(ls "$SOCK" 2>&1)"
    fi
    if [ "$told_rc" -ne 0 ] && [ "$told_rc" -ne 124 ] && echo "$told" | grep -qi 'space'; then
        pass failed-start-client-told-cause
    else
        fail failed-start-client-told-cause "the waiting client got (exit $told_rc): $told"
    fi
    mv "$CONF.good" "$CONF"
    if systemctl start shmbrokerd && ctl status >/dev/null; then
        pass failed-start-fixed-starts
    else
        fail failed-start-fixed-starts "after restoring $CONF: state $(unit_prop shmbrokerd ActiveState)"
    fi
}

readme_steps
check_readiness
check_reload
check_watchdog
check_kill9
check_restart_keeps
check_stop_service_keeps
check_groups
check_dev_shm
check_security
check_stop_both_frees
check_memfd_pool
check_reorder_then_stop
check_failed_start
finish
