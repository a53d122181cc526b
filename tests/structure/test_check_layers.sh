#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check_layers.sh refuses what the map (docs/architecture.md) forbids: each
# case breaks one rule in a scratch copy of the sources and the map, and
# expects the check to fail and to name the offending edge or room. The calls
# come from the real build; the includes and the map from the copy.
#   sh tests/structure/test_check_layers.sh BUILD_DIR   (from the top of the tree)
set -u
top=$(pwd)
build=${1:-${SHMB_BUILD_DIR:-build}}
case "$build" in /*) ;; *) build="$top/$build" ;; esac
check="$top/tests/structure/check_layers.sh"
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A fresh copy of the tree's rooms and map in $tmp/t.
fresh() {
    rm -rf "$tmp/t"
    mkdir -p "$tmp/t/docs"
    cp -r "$top/daemon" "$top/client" "$top/proto" "$tmp/t/"
    [ -d "$top/relay" ] && cp -r "$top/relay" "$tmp/t/"
    rm -rf "$tmp/t/client/python"
    cp -r "$top/systemd" "$tmp/t/"
    cp "$top/docs/architecture.md" "$tmp/t/docs/"
}

# run NAME EXPECTED: the check on the copy must fail and print a line with
# EXPECTED (a fixed string).
expect_fail() {
    (cd "$tmp/t" && sh "$check" "$build") > "$tmp/out" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && grep -qF -- "$2" "$tmp/out"; then
        echo "PASS: $1"
    else
        echo "FAIL: $1: expected a failure naming '$2', got exit $rc:"
        sed 's/^/    /' "$tmp/out"
        fail=1
    fi
}

fresh
(cd "$tmp/t" && sh "$check" "$build") > "$tmp/out" 2>&1
if [ $? -eq 0 ]; then
    echo "PASS: the copy of the tree as it is passes"
else
    echo "FAIL: the copy of the tree as it is passes:"
    sed 's/^/    /' "$tmp/out"
    fail=1
fi

fresh
echo '#include "store.h"' >> "$tmp/t/daemon/ring.c"
expect_fail "an include up a floor is refused" \
    "daemon/ring includes daemon/store: up from floor 2 to floor 3"

fresh
echo '#include "index.h"' >> "$tmp/t/daemon/ring.c"
expect_fail "an include the row says never is refused (ring knows no keys)" \
    "daemon/ring includes daemon/index, which its row says it must never call"

fresh
echo '#include "log.h"' >> "$tmp/t/daemon/index.c"
expect_fail "a never that names a folder is refused (floor 1 stands on proto/ alone)" \
    "daemon/index includes daemon/log, which its row says it must never call"

fresh
echo '#include "../daemon/log.h"' >> "$tmp/t/client/objects.c"
expect_fail "an include into a folder the row does not allow is refused" \
    "client/objects includes daemon/log: client/ may not use daemon/"

fresh
mkdir -p "$tmp/t/relay"
printf '#include "../daemon/log.h"\n' > "$tmp/t/relay/wire.c"
printf '#include "../relay/wire.h"\n' >> "$tmp/t/client/objects.c"
: > "$tmp/t/relay/wire.h"
expect_fail "relay/ using daemon/ is refused once relay/ exists" \
    "relay/wire includes daemon/log: relay/ may not use daemon/"
expect_fail "client/ using relay/ is refused" \
    "client/objects includes relay/wire: client/ may not use relay/"

fresh
printf '// SPDX-License-Identifier: Apache-2.0\n' > "$tmp/t/daemon/spare.c"
expect_fail "a room the map does not list is refused" \
    "daemon/spare is a room of the tree that docs/architecture.md does not list"

fresh
rm -f "$tmp/t/daemon/notify.c" "$tmp/t/daemon/notify.h"
expect_fail "a row for a room that is gone is refused" \
    "docs/architecture.md lists daemon/notify, which has no file in the tree"

fresh
sed -i 's/^| 7 | `daemon\/command`/| x | `daemon\/command`/' "$tmp/t/docs/architecture.md"
expect_fail "a row without a floor is refused" \
    "a Rooms row is | floor (a number)"

fresh
sed -i 's/^| 10 | `daemon\/server`/| 6 | `daemon\/server`/' "$tmp/t/docs/architecture.md"
expect_fail "a call up a floor is refused (from the objects' symbols)" \
    "daemon/server calls daemon/conn: up from floor 6 to floor 9"

fresh
sed -i 's/^\(| 2 | `daemon\/ring` .*\)`daemon\/index`/\1`daemon\/indx`/' "$tmp/t/docs/architecture.md"
expect_fail "a never that names no room or folder is refused (a misspelt rule)" \
    "names daemon/indx, which is neither a room nor a folder of the map"

fresh
sed -i 's/^| 1 | `daemon\/log` |/| 1 | `daemon\/log` | a \\| b |/' "$tmp/t/docs/architecture.md"
sed -i 's/^\(| 1 | `daemon\/log` | a \\| b |\).*/\1 `daemon\/` |/' "$tmp/t/docs/architecture.md"
echo '#include "segment.h"' >> "$tmp/t/daemon/log.c"
expect_fail "an escaped pipe in a cell does not shift the never column" \
    "daemon/log includes daemon/segment, which its row says it must never call"

fresh
echo '| 1 | `lib/spare` | a room of no folder | — |' > "$tmp/row"
sed -i '/^| 1 | `daemon\/log` |/r '"$tmp/row" "$tmp/t/docs/architecture.md"
expect_fail "a room whose folder has no row is refused" \
    "lists lib/spare, whose folder lib/ has no row in Folders"

fresh
sed -i 's/^| `client\/` | `client\/`, `proto\/` |/| `client\/` | `client\/`, `proto\/`, `lib\/` |/' "$tmp/t/docs/architecture.md"
expect_fail "a folder allowed to use a folder the map does not have is refused" \
    "lets a folder use lib/, which has no row of its own"

fresh
echo 'static const int family = AF_INET6;' >> "$tmp/t/daemon/server.c"
expect_fail "an internet socket in the daemon is refused" \
    "FAIL: daemon/ has network code"

fresh
sed -i 's/^RestrictAddressFamilies=.*/RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET/' "$tmp/t/systemd/shmbrokerd.service.in"
expect_fail "a unit that lets the daemon open internet sockets is refused" \
    "has RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET"

fresh
grep '^| 1 | `daemon/log` |' "$tmp/t/docs/architecture.md" > "$tmp/row"
sed -i '/^| 1 | `daemon\/host` |/r '"$tmp/row" "$tmp/t/docs/architecture.md"
expect_fail "a room with two rows is refused" \
    "daemon/log has more than one row"

fresh
rm "$tmp/t/docs/architecture.md"
expect_fail "a tree without its map fails" \
    "the map docs/architecture.md is missing"

exit $fail
