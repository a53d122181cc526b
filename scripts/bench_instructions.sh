#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The daemon's instructions per request, counted by valgrind's callgrind
# over a fixed workload (tests/bench/workload.py): unlike a timing, the count
# does not move with the machine's load, so two builds compare to within a
# fraction of a percent. Run it on two checkouts to compare them.
# Usage: sh scripts/bench_instructions.sh BUILD_DIR [N]
set -eu
build="$1"
n="${2:-3000}"
daemon="$build/shmbrokerd"
[ -x "$daemon" ] || { echo "bench_instructions.sh: $daemon is missing; run make" >&2; exit 2; }
workload="$(dirname "$0")/../tests/bench/workload.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Instructions of a daemon that starts, answers SOCKET's workload of $1
# objects, and stops; the workload's request count in $tmp/sent.
count() {
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.out" "$daemon" \
        --socket "$tmp/s.sock" --shm-dir /dev/shm --name "shmb-ir-$$" --size 64M --fresh \
        2> "$tmp/daemon.log" &
    pid=$!
    if ! python3 "$workload" "$tmp/s.sock" "$1" > "$tmp/sent"; then
        kill -TERM "$pid"
        echo "bench_instructions.sh: the workload failed; the daemon said:" >&2
        cat "$tmp/daemon.log" >&2
        exit 1
    fi
    kill -TERM "$pid"
    wait "$pid" || true
    sed -n 's/^totals: //p' "$tmp/cg.out"
}
rest=$(count 0)
rest_sent=$(cat "$tmp/sent")
total=$(count "$n")
sent=$(cat "$tmp/sent")
echo "daemon instructions: $total for $sent requests, $rest for start, hello and stop"
awk -v t="$total" -v r="$rest" -v s="$sent" -v rs="$rest_sent" \
    'BEGIN { printf "per request: %.0f instructions\n", (t - r) / (s - rs) }'
