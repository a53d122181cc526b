#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The library lends programs only its own names: every global symbol that
# libshmbroker.a defines and every dynamic symbol of libshmbroker.so starts
# with shmb_ (the build links the static library's objects into one and
# keeps only those global; the shared one has a version script).
#   sh tests/structure/check_exports.sh BUILD_DIR
set -u
build=${1:-${SHMB_BUILD_DIR:-build}}
fail=0
for lib in "$build/libshmbroker.a" "$build/libshmbroker.so.1"; do
    case "$lib" in *.so.1) opt=-D ;; *) opt= ;; esac
    if ! syms=$(nm -g $opt --defined-only "$lib" 2>/dev/null | awk 'NF == 3 { print $3 }'); then
        echo "FAIL: cannot read the symbols of $lib (is $build built?)"
        fail=1
        continue
    fi
    others=$(printf '%s\n' "$syms" | grep -v -e '^shmb_' -e '^SHMBROKER_' -e '^$')
    if [ -z "$syms" ]; then
        echo "FAIL: $lib defines no global symbol"
        fail=1
    elif [ -n "$others" ]; then
        echo "FAIL: $lib exports names without the shmb_ prefix:"
        printf '%s\n' "$others" | sed 's/^/    /'
        fail=1
    else
        echo "PASS: $lib exports only shmb_* ($(printf '%s\n' "$syms" | wc -l) symbols)"
    fi
done
exit $fail
