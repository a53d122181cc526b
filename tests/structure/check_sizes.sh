#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Rooms one reads in a sitting: no C file (.c or .h) of daemon/, client/,
# proto/ or relay/ over 800 lines, no C function there over 120, no Python
# file of the package over 800, unless tests/structure/size_exceptions lists
# it. A listed one that is no longer over fails too, so that the list only
# shrinks: strike its line when a split brings it under.
#   sh tests/structure/check_sizes.sh   (from the top of the tree)
# SHMB_SIZE_EXCEPTIONS names another list (the check's own test uses one).
set -u
here=$(cd "$(dirname "$0")" && pwd)
list=${SHMB_SIZE_EXCEPTIONS:-tests/structure/size_exceptions}
# The marks: past these a file or a function is asking to be split (issue 28).
ROOM_MAX=800
FUNCTION_MAX=120
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$list" ]; then
    echo "FAIL: the list of exceptions $list is missing (it may be empty, but it must be there)"
    exit 1
fi

# What is measured: "KIND NAME LINES", KIND room or function.
cfiles=""
for d in daemon client proto relay; do
    for f in "$d"/*.c "$d"/*.h; do
        [ -f "$f" ] && cfiles="$cfiles $f"
    done
done
{
    for f in $cfiles client/python/shmbroker/*.py; do
        [ -f "$f" ] && echo "room $f $(wc -l < "$f")"
    done
    if [ -n "$cfiles" ]; then
        awk -f "$here/c_functions.awk" $cfiles | awk '{ print "function", $1, $2 }'
    fi
} > "$tmp/sizes"
awk -v rm="$ROOM_MAX" -v fm="$FUNCTION_MAX" \
    '($1 == "room" && $3 > rm) || ($1 == "function" && $3 > fm)' "$tmp/sizes" |
    sort -k2,2 > "$tmp/over"

# The list: "KIND NAME LINES why", '#' starts a comment.
awk -v list="$list" '
/^[[:space:]]*(#|$)/ { next }
$1 !~ /^(room|function)$/ || $3 !~ /^[0-9]+$/ {
    printf "BAD %s:%d: a line is \"room FILE LINES why\" or \"function FILE:NAME LINES why\": %s\n", list, NR, $0
    next
}
{ print $1, $2, $3 }' "$list" > "$tmp/listed"
if grep -q '^BAD ' "$tmp/listed"; then
    grep '^BAD ' "$tmp/listed" | sed 's/^BAD /FAIL: /'
    fail=1
fi
grep -v '^BAD ' "$tmp/listed" | sort -k2,2 > "$tmp/allowed"

# Over and not listed; listed and not over; listed and grown (a note only:
# every branch that touches such a room would otherwise have to edit the list).
awk -v rm="$ROOM_MAX" -v fm="$FUNCTION_MAX" -v list="$list" '
FILENAME == ARGV[1] { allowed[$1, $2] = $3; next }
FILENAME == ARGV[2] { now[$1, $2] = $3; next }
{
    kind = $1; name = $2; n = $3
    mark = (kind == "room") ? rm : fm
    if (!((kind, name) in allowed)) {
        printf "FAIL: %s %s has %d lines, over the mark of %d: split it by subject, or list it in %s with why\n", kind, name, n, mark, list
        bad = 1
    }
}
END {
    for (k in allowed) {
        split(k, p, SUBSEP)
        if (!(k in now)) {
            printf "FAIL: %s lists %s %s, which the tree no longer has: strike its line\n", list, p[1], p[2]
            bad = 1
        } else if (now[k] <= (p[1] == "room" ? rm : fm)) {
            printf "FAIL: %s lists %s %s, now %d lines, within the mark: strike its line (the list only shrinks)\n", list, p[1], p[2], now[k]
            bad = 1
        } else {
            grown = (now[k] > allowed[k]) ? sprintf(", %d more than listed", now[k] - allowed[k]) : ""
            printf "note: %s %s: %d lines (listed at %d%s)\n", p[1], p[2], now[k], allowed[k], grown
        }
    }
    exit bad
}' "$tmp/allowed" "$tmp/sizes" "$tmp/over" > "$tmp/out"
rc=$?
sort "$tmp/out"
[ "$rc" -eq 0 ] || fail=1
if [ "$fail" -eq 0 ]; then
    echo "PASS: no file over $ROOM_MAX lines and no C function over $FUNCTION_MAX but the $(wc -l < "$tmp/allowed") listed in $list ($(grep -c '^room' "$tmp/sizes") files, $(grep -c '^function' "$tmp/sizes") functions)"
fi
exit $fail
