# SPDX-License-Identifier: Apache-2.0
# Helpers for the check scripts that run inside the booted container
# (tests/systemd/checks-*.sh). POSIX sh: the container is a minimal Debian
# whose /bin/sh is dash. Source it from a script in the same directory:
#     . "$(dirname "$0")/lib-in.sh"
# Every check prints one line that tests/run.sh counts on the host:
# "PASS: name", "FAIL: name: why" or "SKIP: name (reason)". End the script
# with `finish`, which exits non-zero when any check failed.

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
# systemctl and journalctl must not page or colour what the checks grep.
SYSTEMD_PAGER=
SYSTEMD_COLORS=0
export SYSTEMD_PAGER SYSTEMD_COLORS

# Seconds wait_for and the client helpers give a thing that should happen
# before calling it a failure. Generous: the machine is shared and slow
# beats flaky; nothing here asserts how fast anything is.
WAIT_SECONDS="${WAIT_SECONDS:-30}"

lib_failed=0

# A check that held.
pass() {
    echo "PASS: $1"
}

# A check that did not hold: NAME, then what was seen instead.
fail() {
    lib_name="$1"
    shift
    # One line, whatever the message holds: the host counts lines.
    echo "FAIL: $lib_name: $(printf "%s" "$*" | tr '\n' ' ')"
    lib_failed=$((lib_failed + 1))
}

# A check that cannot be made here: NAME, then why (not counted as passed).
skip() {
    lib_name="$1"
    shift
    echo "SKIP: $lib_name ($*)"
}

# check NAME WHY CMD...: pass NAME when CMD succeeds, else fail with WHY.
check() {
    lib_name="$1"
    lib_why="$2"
    shift 2
    if "$@"; then
        pass "$lib_name"
    else
        fail "$lib_name" "$lib_why"
    fi
}

# Print a note that the host shows in the log but does not count.
note() {
    echo "  note: $*"
}

# End of a check script: the exit status says whether every check held.
finish() {
    if [ "$lib_failed" -gt 0 ]; then
        echo "$lib_failed check(s) failed"
        exit 1
    fi
    exit 0
}

# wait_for [-t SECONDS] CMD...: run CMD every 0.2 s until it succeeds (0) or
# the time is up (1). Its output is discarded.
wait_for() {
    lib_secs="$WAIT_SECONDS"
    if [ "$1" = -t ]; then
        lib_secs="$2"
        shift 2
    fi
    lib_tries=$((lib_secs * 5))
    while [ "$lib_tries" -gt 0 ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
        lib_tries=$((lib_tries - 1))
    done
    return 1
}

# unit_prop UNIT PROPERTY: the property's value (systemctl show).
unit_prop() {
    systemctl show -p "$2" --value "$1" 2>/dev/null
}

# unit_is UNIT PROPERTY VALUE: succeed when the property has that value.
unit_is() {
    [ "$(unit_prop "$1" "$2")" = "$3" ]
}

# The main pid of shmbrokerd.service, or 0 when it does not run.
daemon_pid() {
    unit_prop shmbrokerd.service MainPID
}

# journal_mark: remember where the journal ends now; journal_since_mark
# then prints (message only) what was logged after it, so that a check
# greps its own lines and not an earlier test's.
journal_mark() {
    journalctl --flush >/dev/null 2>&1 || true
    lib_cursor=$(journalctl -n 0 --show-cursor --no-pager 2>/dev/null |
        sed -n 's/^-- cursor: //p')
}

# Every journal message since journal_mark (all units), one per line.
journal_since_mark() {
    if [ -n "${lib_cursor:-}" ]; then
        journalctl --no-pager -o cat --after-cursor="$lib_cursor" 2>/dev/null
    else
        journalctl --no-pager -o cat -b 2>/dev/null
    fi
}

# journal_has PATTERN: succeed when a line since journal_mark matches the
# extended regular expression (wait_for it: journald may lag).
journal_has() {
    journal_since_mark | grep -Eq -- "$1"
}

# as_user USER CMD...: run CMD as USER with that user's groups, the way a
# worker logged in as USER would (runuser is in util-linux, present in a
# minimal Debian; it sets the supplementary groups from /etc/group).
as_user() {
    lib_user="$1"
    shift
    runuser -u "$lib_user" -- "$@"
}

# The client side, through the installed shmbrokerctl. Each call is bounded
# so that a client the daemon never answers is a failed check, not a hang.

# ctl ARG...: shmbrokerctl with a time limit (exit 124 when it ran out).
ctl() {
    timeout "$WAIT_SECONDS" shmbrokerctl "$@"
}

# put_object KEY TEXT: store TEXT under KEY (exit status of the ctl).
put_object() {
    printf '%s' "$2" | ctl put "$1" -
}

# get_object KEY: print KEY's bytes (exit status of the ctl).
get_object() {
    ctl get "$1" -
}

# object_is KEY TEXT: succeed when KEY holds exactly TEXT.
object_is() {
    lib_got=$(get_object "$1" 2>/dev/null) || return 1
    [ "$lib_got" = "$2" ]
}
