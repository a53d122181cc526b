#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The soak with shmbrokerd under valgrind's memcheck, for
# SOAK_VALGRIND_SECONDS (default 4): any memcheck error or definite/indirect
# leak makes the daemon exit 99 on SIGTERM, and the soak fails.
# Environment: SHMB_SOAK (the soak program), SHMBROKERD (the daemon).
#
# valgrind cannot run an AddressSanitizer binary (their shadow memories
# collide), so when SHMBROKERD is one, the plain build's daemon is built and
# used instead: memcheck then checks the same sources without ASan.
soak="${SHMB_SOAK:-build/tests/soak}"
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

if ! command -v valgrind >/dev/null 2>&1; then
    echo "SKIP: soak_valgrind (valgrind not installed)"
    exit 0
fi
if [ ! -x "$soak" ]; then
    echo "FAIL: soak_valgrind ($soak is missing; run make $soak)"
    exit 1
fi

daemon="${SHMBROKERD:-$root/build/shmbrokerd}"
if grep -q __asan_init "$daemon" 2>/dev/null; then
    echo "soak_valgrind: $daemon is an AddressSanitizer build; building $root/build/shmbrokerd for valgrind"
    # The sub-make must not inherit SANITIZER=address through MAKEFLAGS.
    if ! env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make -s -C "$root" --no-print-directory \
        SANITIZER= build/shmbrokerd; then
        echo "FAIL: soak_valgrind (cannot build $root/build/shmbrokerd)"
        exit 1
    fi
    daemon="$root/build/shmbrokerd"
fi

if SOAK_VALGRIND=1 SOAK_SECONDS="${SOAK_VALGRIND_SECONDS:-4}" SHMBROKERD="$daemon" \
    "$soak"; then
    echo "PASS: soak_valgrind (${SOAK_VALGRIND_SECONDS:-4}s, shmbrokerd under memcheck: no error, no leak)"
else
    echo "FAIL: soak_valgrind (see the report above)"
    exit 1
fi
