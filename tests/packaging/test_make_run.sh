#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# 'make run' and 'make' on a built tree print nothing of make's own before
# the daemon's lines: no "make[1]: '...' is up to date." per file, no
# "Nothing to be done". RUN_ARGS passes the daemon its flags (--version here,
# so that it exits at once).
. "$(dirname "$0")/lib.sh"

tmake all >"$tmp/first" 2>&1 || { cat "$tmp/first"; fail "make all"; exit 1; }

# Bounded: a make that ignored RUN_ARGS would start a daemon that stays.
if timeout -k 5 60 env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -C "$root" \
    BUILD="$build" run RUN_ARGS=--version >"$tmp/out" 2>&1 && grep -q '^shmbrokerd ' "$tmp/out"; then
    if grep -Eq "is up to date|Nothing to be done" "$tmp/out"; then
        cat "$tmp/out"
        fail "make_run_quiet: make's own lines before the daemon's"
    else
        pass "make_run_quiet"
    fi
else
    cat "$tmp/out"
    fail "make_run_quiet: make run RUN_ARGS=--version did not run the daemon"
fi

if tmake all >"$tmp/out" 2>&1 && ! grep -Eq "is up to date|Nothing to be done" "$tmp/out"; then
    pass "make_all_quiet"
else
    cat "$tmp/out"
    fail "make_all_quiet: make on a built tree printed make's own lines"
fi

[ "$fails" -eq 0 ]
