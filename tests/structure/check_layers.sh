#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The house's one rule about dependencies: they point one way. No module of
# daemon/, client/ or proto/ (x.c with x.h) includes, or calls into, a module
# that includes or calls it back, directly or through others. Reads the
# #include lines of the sources and the symbols of the objects the build
# made; tsort refuses a graph with a loop and names the modules in it.
#   sh tests/structure/check_layers.sh BUILD_DIR
set -u
build=${1:-${SHMB_BUILD_DIR:-build}}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

module() { # path -> module name: daemon/conn.c and daemon/conn.h are daemon/conn
    echo "$1" | sed -e 's|^\./||' -e 's|\.[ch]$||' -e 's|\.def$||'
}

# Includes: an edge from each file's module to each project header's module.
for f in daemon/*.[ch] client/*.[ch] proto/*.[ch]; do
    [ -f "$f" ] || continue
    dir=$(dirname "$f")
    grep -E '^#[[:space:]]*include[[:space:]]+"' "$f" | sed -E 's/.*"([^"]+)".*/\1/' |
        while read -r inc; do
            case "$inc" in ../*) path=$(echo "$inc" | sed 's|^\.\./||') ;; *) path="$dir/$inc" ;; esac
            [ -f "$path" ] || continue
            a=$(module "$f"); b=$(module "$path")
            [ "$a" != "$b" ] && echo "$a $b"
        done
done > "$tmp/includes"
# Calls: an edge from each object to the object that defines a symbol it uses.
for o in $(find "$build/obj/daemon" "$build/obj/client" "$build/obj/proto" -name '*.o' 2>/dev/null); do
    m=$(module "${o#$build/obj/}" | sed 's|\.o$||')
    nm --defined-only -g "$o" | awk -v m="$m" 'NF == 3 { print $3, m }'
done | sort > "$tmp/defined"
for o in $(find "$build/obj/daemon" "$build/obj/client" "$build/obj/proto" -name '*.o' 2>/dev/null); do
    m=$(module "${o#$build/obj/}" | sed 's|\.o$||')
    nm -u "$o" | awk -v m="$m" '{ print $2, m }'
done | sort > "$tmp/used"
join "$tmp/used" "$tmp/defined" | awk '$2 != $3 { print $2, $3 }' | sort -u > "$tmp/calls"

for kind in includes calls; do
    n=$(wc -l < "$tmp/$kind")
    if [ "$n" -eq 0 ]; then
        echo "FAIL: no $kind found (is $build built?)"
        fail=1
        continue
    fi
    if tsort "$tmp/$kind" > /dev/null 2> "$tmp/err"; then
        echo "PASS: no loop in the $kind between modules ($n edges)"
    else
        echo "FAIL: no loop in the $kind between modules; tsort found one:"
        sed 's/^/    /' "$tmp/err"
        fail=1
    fi
done
exit $fail
