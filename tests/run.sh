#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Run shmbroker's test programs and total their cases.
# Usage: sh tests/run.sh BUILD_DIR BIN...
#
# A cmocka program's cases are counted from its summary lines; any other
# executable (an end-to-end script) counts its "PASS: name", "FAIL: name" and
# "SKIP: name" lines, or is one case that passes iff it exits 0. Every program
# runs under a timeout: SHMB_TEST_TIMEOUT seconds (default 300), plus the
# length asked for of the soak (SOAK_SECONDS), its valgrind run
# (SOAK_VALGRIND_SECONDS) and the fuzzers (FUZZ_SECONDS, FUZZ_ADOPT_SECONDS). Output is shown as it comes; the log of a program that
# failed is kept in BUILD_DIR/test-logs. The last line is
# "N passed, N failed[, N skipped]"; the exit status is non-zero when any case
# or any program failed (non-zero exit, signal, timeout).

# A test program that takes longer than this is hung, not slow.
TEST_TIMEOUT="${SHMB_TEST_TIMEOUT:-300}"

# The seconds a program was asked to run for (make soak SOAK_SECONDS=600):
# its limit is that plus TEST_TIMEOUT, so a long run is not taken for a hang.
asked_seconds() {
    case "$1" in
    soak) n="${SOAK_SECONDS:-0}" ;;
    soak_valgrind.sh) n="${SOAK_VALGRIND_SECONDS:-0}" ;;
    run_fuzz.sh) n="${FUZZ_SECONDS:-0}" ;;
    run_fuzz_adopt.sh) n="${FUZZ_ADOPT_SECONDS:-0}" ;;
    # tests/systemd/run.sh: a cold run debootstraps its root and builds the .deb.
    run.sh) n=300 ;;
    *) n=0 ;;
    esac
    case "$n" in
    '' | *[!0-9]*) n=0 ;;
    esac
    echo "$n"
}

if [ $# -lt 1 ]; then
    echo "usage: sh tests/run.sh BUILD_DIR BIN..." >&2
    exit 2
fi
build="$1"
shift

logdir="$build/test-logs"
mkdir -p "$logdir" || exit 2

if command -v timeout >/dev/null 2>&1; then
    have_timeout=1
else
    have_timeout=0
    echo "run.sh: 'timeout' not found; tests run without a time limit" >&2
fi

# cmocka's summary format is parsed below; make sure no other is chosen.
CMOCKA_MESSAGE_OUTPUT=stdout
export CMOCKA_MESSAGE_OUTPUT
SHMB_BUILD_DIR="$build"
export SHMB_BUILD_DIR

total_pass=0
total_fail=0
total_skip=0
bad_bins=""

# Sum the numbers in "PATTERN N" matches of file $2 for the sed expression $1.
sum_matches() {
    sed -n "$1" "$2" | awk '{ s += $1 } END { print s + 0 }'
}

# Count lines of file $2 that match the basic regular expression $1.
count_lines() {
    grep -c "$1" "$2" 2>/dev/null || true
}

for bin in "$@"; do
    name=$(basename "$bin")
    log="$logdir/$name.log"
    rcfile="$logdir/$name.rc"
    echo "==== $name"
    if [ ! -x "$bin" ]; then
        echo "run.sh: $bin is missing or not executable" | tee "$log"
        total_fail=$((total_fail + 1))
        bad_bins="$bad_bins $name"
        continue
    fi
    rm -f "$rcfile"
    limit=$((TEST_TIMEOUT + $(asked_seconds "$name")))
    # Keep the exit status across the pipe: POSIX sh has no pipefail.
    {
        if [ "$have_timeout" -eq 1 ]; then
            timeout -k 10 "$limit" "$bin" 2>&1
        else
            "$bin" 2>&1
        fi
        echo $? >"$rcfile"
    } | tee "$log"
    rc=$(cat "$rcfile" 2>/dev/null)
    [ -n "$rc" ] || rc=1
    rm -f "$rcfile"

    pass=0
    fail=0
    skip=0
    why=""
    if grep -q '^\[==========\] Running [0-9][0-9]* test(s)\.' "$log"; then
        # cmocka: "[==========] Running N test(s)." per group, then
        # "[  PASSED  ] N test(s)." and, when non-zero, "[  SKIPPED ] N test(s),
        # listed below:". Everything planned that neither passed nor was
        # skipped failed: assertion failures, setup errors, a crash or a hang.
        planned=$(sum_matches 's/.*\[==========\] Running \([0-9][0-9]*\) test(s)\..*/\1/p' "$log")
        if grep -q '\[  PASSED  \] [0-9][0-9]* test(s)\.' "$log"; then
            pass=$(sum_matches 's/.*\[  PASSED  \] \([0-9][0-9]*\) test(s)\..*/\1/p' "$log")
            skip=$(sum_matches 's/.*\[  SKIPPED \] \([0-9][0-9]*\) test(s).*/\1/p' "$log")
        else
            # No summary: the program died. Count the cases that finished.
            pass=$(count_lines '^\[       OK \] ' "$log")
            skip=$(count_lines '^\[  SKIPPED \] ' "$log")
        fi
        fail=$((planned - pass - skip))
        [ "$fail" -ge 0 ] || fail=0
    elif grep -Eq '^(PASS|FAIL|SKIP): ' "$log"; then
        pass=$(count_lines '^PASS: ' "$log")
        fail=$(count_lines '^FAIL: ' "$log")
        skip=$(count_lines '^SKIP: ' "$log")
    elif [ "$rc" -eq 0 ]; then
        pass=1
    fi

    if [ "$rc" -ne 0 ]; then
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            why="timed out after ${limit}s"
        elif [ "$rc" -gt 128 ]; then
            why="killed by signal $((rc - 128))"
        else
            why="exit status $rc"
        fi
        # A program that failed must count at least one failed case, even
        # when all its cases passed (a leak report at exit, for example).
        [ "$fail" -gt 0 ] || fail=1
    fi

    total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail))
    total_skip=$((total_skip + skip))
    if [ "$rc" -ne 0 ] || [ "$fail" -gt 0 ]; then
        bad_bins="$bad_bins $name"
        echo "---- $name: FAILED (${why:-failed cases}); log kept in $log"
    else
        rm -f "$log"
        if [ "$skip" -gt 0 ]; then
            echo "---- $name: $pass passed, $skip skipped"
        else
            echo "---- $name: $pass passed"
        fi
    fi
done

if [ -n "$bad_bins" ]; then
    echo "failed:$bad_bins"
fi
if [ "$total_skip" -gt 0 ]; then
    echo "$total_pass passed, $total_fail failed, $total_skip skipped"
else
    echo "$total_pass passed, $total_fail failed"
fi
[ -z "$bad_bins" ] && [ "$total_fail" -eq 0 ]
