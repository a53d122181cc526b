#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The house's rules about dependencies, read from the map of the tree
# (docs/architecture.md, its tables "Folders" and "Rooms"): a room (module:
# x.c with x.h, or a header or .def alone) of daemon/, client/, proto/ or
# relay/ includes or calls only rooms of the folders its folder may use, on
# its own floor or below, never one its row says it must never call; every
# room has a row and every row a room; and nothing loops (tsort). Reads the
# #include lines of the sources and the symbols of the objects the build
# made.
#   sh tests/structure/check_layers.sh BUILD_DIR   (from the top of the tree)
# SHMB_MAP names another map (the check's own test uses a scratch copy).
set -u
build=${1:-${SHMB_BUILD_DIR:-build}}
map=${SHMB_MAP:-docs/architecture.md}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

module() { # path -> module name: daemon/conn.c and daemon/conn.h are daemon/conn
    echo "$1" | sed -e 's|^\./||' -e 's|\.[ch]$||' -e 's|\.def$||'
}

if [ ! -f "$map" ]; then
    echo "FAIL: the map $map is missing: it holds the rules this check reads"
    exit 1
fi

# The tables: each row's cells, their names taken from the code spans.
# folders: "FOLDER USED..."; rooms: "LINE FLOOR ROOM"; never: "ROOM TARGET".
awk -v folders="$tmp/folders" -v rooms="$tmp/rooms" -v never="$tmp/never" \
    -v bad="$tmp/bad" -v map="$map" '
function spans(cell, out,    n) {
    n = 0
    while (match(cell, /`[^`]+`/)) {
        out[++n] = substr(cell, RSTART + 1, RLENGTH - 2)
        cell = substr(cell, RSTART + RLENGTH)
    }
    return n
}
function strip(name) { sub(/\.(c|h|def)$/, "", name); return name }
/^```/ { fence = !fence; next }
fence { next }
/^#/ { table = ($0 ~ /^## Folders[[:space:]]*$/) ? "folders" : ($0 ~ /^## Rooms[[:space:]]*$/) ? "rooms" : ""; next }
table == "" || !/^\|/ { next }
{
    row = $0
    gsub(/\\\|/, "/", row) # an escaped pipe inside a cell is not a border
    n = split(row, cell, "|")
    # cell[1] is empty (the line starts with |); a header or rule row is passed over.
    if (cell[2] ~ /^[[:space:]]*(folder|floor)[[:space:]]*$/ || cell[2] ~ /^[[:space:]:-]+$/) next
    if (table == "folders") {
        if (spans(cell[2], f) != 1 || f[1] !~ /\/$/) {
            printf "%s:%d: a Folders row names one folder in code, ending in /: %s\n", map, NR, $0 > bad
            next
        }
        k = spans(cell[3], u)
        line = f[1]
        for (i = 1; i <= k; i++) line = line " " u[i]
        print line > folders
    } else {
        floor = cell[2]; gsub(/[[:space:]]/, "", floor)
        if (floor !~ /^[0-9]+$/ || spans(cell[3], r) != 1) {
            printf "%s:%d: a Rooms row is | floor (a number) | `room` | what it owns | never calls |: %s\n", map, NR, $0 > bad
            next
        }
        room = strip(r[1])
        print NR, floor, room > rooms
        k = spans(cell[5], v)
        for (i = 1; i <= k; i++) print room, strip(v[i]) > never
    }
}' "$map"
touch "$tmp/folders" "$tmp/rooms" "$tmp/never" "$tmp/bad"
if [ -s "$tmp/bad" ]; then
    sed 's/^/FAIL: /' "$tmp/bad"
    fail=1
fi
if [ ! -s "$tmp/folders" ] || [ ! -s "$tmp/rooms" ]; then
    echo "FAIL: $map has no Folders or no Rooms table (headings '## Folders', '## Rooms')"
    exit 1
fi

# Every name the tables use is a folder of Folders or a room of Rooms, so
# that a misspelt rule is not a rule that never applies.
awk -v map="$map" '
function folder(m) { sub(/\/[^\/]*$/, "/", m); return m }
FILENAME == ARGV[1] { isfolder[$1] = 1; for (i = 2; i <= NF; i++) uses[$i] = 1; next }
FILENAME == ARGV[2] { isroom[$3] = 1; roomfolder[$3] = folder($3); next }
{ never[$2] = never[$2] " " $1 }
END {
    for (f in uses) if (!(f in isfolder))
        printf "FAIL: %s (Folders) lets a folder use %s, which has no row of its own\n", map, f
    for (r in roomfolder) if (!(roomfolder[r] in isfolder))
        printf "FAIL: %s (Rooms) lists %s, whose folder %s has no row in Folders\n", map, r, roomfolder[r]
    for (t in never) if (!(t in isroom) && !(t in isfolder))
        printf "FAIL: %s (Rooms): the never of%s names %s, which is neither a room nor a folder of the map\n", map, never[t], t
}' "$tmp/folders" "$tmp/rooms" "$tmp/never" > "$tmp/names"
if [ -s "$tmp/names" ]; then
    cat "$tmp/names"
    fail=1
fi

# The folders the map names that the tree has; a folder it does not have yet
# (relay/ before the relay lands) is passed over whole.
dirs=""
for f in $(cut -d' ' -f1 "$tmp/folders"); do
    d=${f%/}
    if [ -d "$d" ]; then
        dirs="$dirs $d"
    else
        n=$(awk -v d="$d/" 'index($3, d) == 1' "$tmp/rooms" | wc -l)
        echo "note: $f is not in this tree; its $n rows in $map wait for it"
    fi
done

# Every room has one row, and every row of a folder in the tree a room.
for d in $dirs; do
    for f in "$d"/*.c "$d"/*.h "$d"/*.def; do
        [ -f "$f" ] && module "$f"
    done
done | sort -u > "$tmp/present"
for d in $dirs; do
    awk -v d="$d/" 'index($3, d) == 1 { print $3 }' "$tmp/rooms"
done | sort > "$tmp/listed"
uniq -d "$tmp/listed" | while read -r m; do
    echo "FAIL: $m has more than one row in $map (Rooms)"
done > "$tmp/dups"
sort -u "$tmp/listed" -o "$tmp/listed"
comm -23 "$tmp/present" "$tmp/listed" | while read -r m; do
    echo "FAIL: $m is a room of the tree that $map does not list: add its row to Rooms (floor, what it owns, what it must never call)"
done >> "$tmp/dups"
comm -13 "$tmp/present" "$tmp/listed" | while read -r m; do
    echo "FAIL: $map lists $m, which has no file in the tree: remove its row, or fix its name"
done >> "$tmp/dups"
if [ -s "$tmp/dups" ]; then
    cat "$tmp/dups"
    fail=1
else
    echo "PASS: $map lists every room of$dirs, once, and no room that is gone ($(wc -l < "$tmp/present") rooms)"
fi

# Includes: an edge from each file's module to each project header's module
# (a header that is not a file of the tree, such as <uv.h>, is no edge).
for d in $dirs; do
    for f in "$d"/*.[ch]; do
        [ -f "$f" ] && echo "$f"
    done
done > "$tmp/files"
xargs awk '
function strip(p) { sub(/\.(c|h|def)$/, "", p); return p }
/^#[[:space:]]*include[[:space:]]+"/ {
    inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*$/, "", inc)
    dir = FILENAME; sub(/\/[^\/]*$/, "", dir)
    path = (inc ~ /^\.\.\//) ? substr(inc, 4) : dir "/" inc
    a = strip(FILENAME); b = strip(path)
    if (a != b) print a, b, path
}' < "$tmp/files" | while read -r a b path; do
    [ -f "$path" ] && echo "$a $b"
done | sort -u > "$tmp/includes"
# Calls: an edge from each object to the object that defines a symbol it uses.
objs=$(for d in $dirs; do find "$build/obj/$d" -name '*.o' 2>/dev/null; done)
: > "$tmp/defined"
: > "$tmp/used"
if [ -n "$objs" ]; then
    # nm -A prints "object.o:[address] type symbol"; the module is the object's path.
    # libc's calls that the relay defines over libc's for UCX's sake
    # (relay/admit, relay/tcp_guard) are libc's to every other room.
    nm -A --defined-only -g $objs | awk -v b="$build/obj/" '
        $NF ~ /^(accept|recv|send|sendmsg|connect|close)$/ { next }
        { m = $1; sub(/\.o:.*$/, "", m); m = substr(m, length(b) + 1)
          print $NF, m }' | sort > "$tmp/defined"
    nm -A -u $objs | awk -v b="$build/obj/" '
        { m = $1; sub(/\.o:.*$/, "", m); m = substr(m, length(b) + 1)
          print $NF, m }' | sort > "$tmp/used"
fi
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
    # The map's rules, edge by edge.
    verb=$(echo "$kind" | sed 's/s$//;s/$/s/')
    awk -v verb="$verb" -v map="$map" '
    function folder(m) { sub(/\/[^\/]*$/, "/", m); return m }
    FILENAME == ARGV[1] { for (i = 2; i <= NF; i++) may[$1, $i] = 1; next }
    FILENAME == ARGV[2] { floor[$3] = $2; next }
    FILENAME == ARGV[3] { never[$1, $2] = 1; next }
    {
        a = $1; b = $2; fa = folder(a); fb = folder(b)
        if (!((fa, fb) in may)) {
            printf "FAIL: %s %s %s: %s may not use %s (%s, Folders)\n", a, verb, b, fa, fb, map
            bad = 1
        }
        if (fa == fb && (a in floor) && (b in floor) && floor[b] + 0 > floor[a] + 0) {
            printf "FAIL: %s %s %s: up from floor %d to floor %d (%s, Rooms)\n", a, verb, b, floor[a], floor[b], map
            bad = 1
        }
        if ((a, b) in never || (a, fb) in never) {
            printf "FAIL: %s %s %s, which its row says it must never call (%s, Rooms)\n", a, verb, b, map
            bad = 1
        }
    }
    END { exit bad }' "$tmp/folders" "$tmp/rooms" "$tmp/never" "$tmp/$kind" > "$tmp/rules"
    if [ -s "$tmp/rules" ]; then
        cat "$tmp/rules"
        fail=1
    else
        echo "PASS: the $n $kind between modules follow $map (folders, floors, never)"
    fi
done
# The relay's place is decided so that the daemon grows no network stack
# (the map, "The relay"): no internet socket in daemon/, and a unit that
# keeps the daemon to local families.
net='AF_INET|PF_INET|AF_PACKET|sockaddr_in|getaddrinfo|gethostbyname'
if grep -nE "$net" daemon/*.[ch] > "$tmp/net" 2>/dev/null; then
    echo "FAIL: daemon/ has network code; what crosses hosts belongs in relay/ ($map, The relay):"
    sed 's/^/    /' "$tmp/net"
    fail=1
else
    echo "PASS: daemon/ has no network code (none of $net)"
fi
unit=systemd/shmbrokerd.service.in
if [ -f "$unit" ]; then
    families=$(sed -n 's/^RestrictAddressFamilies=//p' "$unit")
    if [ -z "$families" ] || echo "$families" | grep -qvE '^(AF_UNIX|AF_NETLINK)( (AF_UNIX|AF_NETLINK))*$'; then
        echo "FAIL: $unit has RestrictAddressFamilies=$families: the daemon keeps to AF_UNIX (and AF_NETLINK for sock_diag); what crosses hosts belongs in relay/"
        fail=1
    else
        echo "PASS: $unit keeps the daemon to $families"
    fi
fi
exit $fail
