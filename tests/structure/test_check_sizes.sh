#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check_sizes.sh names what passes the marks and is not listed, and a listed
# exception that no longer needs its line: each case changes one thing in a
# scratch copy of the sources and expects the check to fail and name it.
#   sh tests/structure/test_check_sizes.sh   (from the top of the tree)
set -u
top=$(pwd)
check="$top/tests/structure/check_sizes.sh"
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A fresh copy of the sources and the list in $tmp/t.
fresh() {
    rm -rf "$tmp/t"
    mkdir -p "$tmp/t/tests/structure"
    cp -r "$top/daemon" "$top/client" "$top/proto" "$tmp/t/"
    [ -d "$top/relay" ] && cp -r "$top/relay" "$tmp/t/"
    cp "$top/tests/structure/size_exceptions" "$tmp/t/tests/structure/"
}

# The check on the copy must fail and print a line with $2 (a fixed string).
expect_fail() {
    (cd "$tmp/t" && sh "$check") > "$tmp/out" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && grep -qF -- "$2" "$tmp/out"; then
        echo "PASS: $1"
    else
        echo "FAIL: $1: expected a failure naming '$2', got exit $rc:"
        sed 's/^/    /' "$tmp/out"
        fail=1
    fi
}

# N lines of a function named $1 whose first lines hold braces in a string,
# a character constant and comments, which a scan must not count.
long_function() {
    echo "int $1(void)"
    echo "{"
    echo '    const char *s = "}}"; /* } */ char c = '"'}'"'; // }'
    i=3
    while [ "$i" -lt "$(($2 - 1))" ]; do
        echo "    (void)s; (void)c;"
        i=$((i + 1))
    done
    echo "}"
}

fresh
(cd "$tmp/t" && sh "$check") > "$tmp/out" 2>&1
if [ $? -eq 0 ]; then
    echo "PASS: the copy of the tree as it is passes"
else
    echo "FAIL: the copy of the tree as it is passes:"
    sed 's/^/    /' "$tmp/out"
    fail=1
fi

fresh
yes '/* filler */' | head -n 900 >> "$tmp/t/proto/utf8.c"
expect_fail "a C file over 800 lines, not listed, is named" \
    "room proto/utf8.c has $(wc -l < "$tmp/t/proto/utf8.c") lines"

fresh
yes '# filler' | head -n 900 >> "$tmp/t/client/python/shmbroker/errors.py"
expect_fail "a Python file over 800 lines, not listed, is named" \
    "room client/python/shmbroker/errors.py has"

fresh
long_function spare_function 130 >> "$tmp/t/proto/utf8.c"
expect_fail "a function over 120 lines is named with its length, braces in strings and comments not counted" \
    "function proto/utf8.c:spare_function has 130 lines"

fresh
long_function spare_function 120 >> "$tmp/t/proto/utf8.c"
(cd "$tmp/t" && sh "$check") > "$tmp/out" 2>&1
if [ $? -eq 0 ]; then
    echo "PASS: a function of 120 lines is within the mark"
else
    echo "FAIL: a function of 120 lines is within the mark:"
    sed 's/^/    /' "$tmp/out"
    fail=1
fi

fresh
# Listed here, whatever the real list holds by now (the splits strike lines).
echo "room     daemon/server.c                                   839  a line of this test" \
    >> "$tmp/t/tests/structure/size_exceptions"
head -n 100 "$top/daemon/server.c" > "$tmp/t/daemon/server.c"
expect_fail "a listed file that is no longer over fails, so that the list shrinks" \
    "lists room daemon/server.c, now 100 lines, within the mark"

# A room of its own, listed here: the list's rooms are struck as they are
# split, so the case must not lean on one of them.
fresh
echo "room     client/gone.c                                     900  split away" \
    >> "$tmp/t/tests/structure/size_exceptions"
expect_fail "a listed file that is gone fails" \
    "lists room client/gone.c, which the tree no longer has"

fresh
echo "room daemon/store.c many" >> "$tmp/t/tests/structure/size_exceptions"
expect_fail "a line of the list without a number fails" \
    'a line is "room FILE LINES why"'

exit $fail
