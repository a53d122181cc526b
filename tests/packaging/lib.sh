# SPDX-License-Identifier: Apache-2.0
# Shared by the packaging tests: the tree, the build they test, a make that
# ignores the outer make's flags, PASS/FAIL lines, a private daemon.
# Sourced, not run. Sets: root, build, tmp (removed at exit), fails.

root=$(cd "$(dirname "$0")/../.." && pwd) || exit 1
build="${SHMB_BUILD_DIR:-build}"
case "$build" in
/*) ;;
*) build="$root/$build" ;;
esac
SHMBROKERD="${SHMBROKERD:-$build/shmbrokerd}"
case "$SHMBROKERD" in
/*) ;;
*) SHMBROKERD="$root/$SHMBROKERD" ;;
esac
tmp=$(mktemp -d /tmp/shmb-pkg.XXXXXX) || exit 1
daemon_pid=""
fails=0
cleanup() {
    if [ -n "$daemon_pid" ]; then
        kill "$daemon_pid" 2>/dev/null
        wait "$daemon_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

pass() { echo "PASS: $1"; }
fail() {
    echo "FAIL: $1"
    fails=$((fails + 1))
}

# make in the tree, on the build under test, without the outer make's flags
# (tests/run.sh runs under 'make test').
tmake() {
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -C "$root" \
        BUILD="$build" "$@"
}

# Start a daemon on $tmp/sock with a small segment of its own; it stops when
# this shell exits. Returns non-zero when it does not answer within 30 s.
start_daemon() {
    "$SHMBROKERD" --socket "$tmp/sock" --name "shmb-pkg-$$" --size 8M \
        --stop-with-pid $$ >"$tmp/daemon.log" 2>&1 &
    daemon_pid=$!
    i=0
    while [ ! -S "$tmp/sock" ]; do
        i=$((i + 1))
        if [ "$i" -gt 300 ] || ! kill -0 "$daemon_pid" 2>/dev/null; then
            cat "$tmp/daemon.log"
            return 1
        fi
        sleep 0.1
    done
}
