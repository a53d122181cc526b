#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# shmbroker's benchmark: shmbroker against Redis over a Unix socket, memcpy
# of the same bytes and a bare Unix-socket round trip, in one run, so that
# the ratios compare figures taken on the same machine at the same time; then
# the same from Python (tests/bench/bench_python.py) against redis-py,
# multiprocessing.Queue and multiprocessing.shared_memory; then the broadcast
# queues (tests/bench/queue_bench.c) against a busy-polling ring, ZeroMQ
# PUB/SUB and a Unix-socket fan-out; and what one multimodal store shared
# by several vLLM API servers saves (tests/bench/bench_vllm_shared.py).
# Usage: sh scripts/bench.sh BUILD_DIR   (BENCH_QUICK=1 for a smoke run,
# BENCH_ONLY=queues for the queue tables alone, BENCH_ONLY=reads for the new
# calls' tables alone: shmb_put through the arena + shmb_read against Redis,
# hot reads from 1 to 16 processes)
#
# shmb_read makes no system call on its hot path. To see it, count the
# system calls of a read run of a thousand reads and of a million against a
# running daemon: the totals differ only by the reader's look at its
# connection, one poll() per 10 ms of reading (connect, hello, mapping, the
# put before the clock, the fork and barrier; then only reads). This script does
# it when strace is installed; by hand:
#   strace -f -c -o /tmp/reads.strace build/shmb-bench --mode read --size 64 \
#       --ops 1000000 --socket /run/shmbroker/shmbroker.sock
#
# Starts its own shmbrokerd (1 GiB segment in /dev/shm; the queues get one of
# their own) and redis-server (persistence off, a temporary Unix socket),
# stops them at the end, and
# writes the table to BUILD_DIR/bench-results.txt and every measurement as a
# JSON line to BUILD_DIR/bench-results.json. Nothing here asserts a timing.
set -u

if [ $# -ne 1 ]; then
    echo "usage: sh scripts/bench.sh BUILD_DIR" >&2
    exit 2
fi
build="$1"
bench="$build/shmb-bench"
daemon="$build/shmbrokerd"
qbench="$build/shmb-queue-bench"
txt="$build/bench-results.txt"
json="$build/bench-results.json"
for f in "$bench" "$qbench" "$daemon"; do
    [ -x "$f" ] || { echo "bench.sh: $f is missing; run make bench" >&2; exit 2; }
done
command -v redis-server >/dev/null 2>&1 ||
    { echo "bench.sh: redis-server not found (sh scripts/install-deps.sh bench)" >&2; exit 2; }

# The matrix. Each measurement runs for $secs seconds; 16 MiB with 16
# clients moves 256 MiB per round, so a second holds a few rounds only.
if [ "${BENCH_QUICK:-0}" = 1 ]; then
    sizes="64 4096 1048576"
    clients_list="1 16"
    secs=0.3
    scale_objects=100000
else
    sizes="64 4096 65536 1048576 16777216"
    clients_list="1 16"
    secs=1.5
    scale_objects=1000000
fi
batch=16
batch_max_size=65536 # batches are for small objects; big ones are data-bound

tmp=$(mktemp -d /tmp/shmb-bench.XXXXXX) || exit 1
name="shmb-bench-$$"
dpid=""
rpid=""
extra_pids=""

# Stop whatever this script started and remove its files, however it ends.
cleanup() {
    for p in $dpid $rpid $extra_pids; do
        kill -TERM "$p" 2>/dev/null
    done
    for p in $dpid $rpid $extra_pids; do
        wait "$p" 2>/dev/null
    done
    rm -f "/dev/shm/$name" "/dev/shm/$name-scale" "/dev/shm/$name-4g" "/dev/shm/$name-q"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
    echo "bench.sh: $*" >&2
    for log in "$tmp"/*.log; do
        [ -s "$log" ] && { echo "---- $log" >&2; tail -20 "$log" >&2; }
    done
    exit 1
}

# Start shmbrokerd NAME SIZE SOCKET; sets $started. Waits until it answers hello.
start_daemon() {
    "$daemon" --size "$2" --max-object-size 64M --name "$1" --shm-dir /dev/shm \
        --socket "$3" --log-level warn >"$tmp/$1.log" 2>&1 &
    started=$!
    "$bench" --mode ready --socket "$3" --seconds 20 >/dev/null ||
        die "shmbrokerd --size $2 did not become ready"
}

# Stop a daemon started above and wait for it.
stop_pid() {
    kill -TERM "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}

# A field of a JSON line: field LINE NAME.
field() {
    printf '%s\n' "$1" | sed -n "s/.*\"$2\":\"*\([^,\"}]*\).*/\1/p"
}

# Run shmb-bench with the given options; the JSON line goes to $json and
# into $last. An empty $last means the run failed.
run() {
    out=$("$bench" "$@" 2>"$tmp/run.err")
    last=$(printf '%s\n' "$out" | grep '^{' | tail -1)
    if [ -z "$last" ]; then
        echo "bench.sh: shmb-bench $* failed: $(cat "$tmp/run.err")" >&2
        return 1
    fi
    printf '%s\n' "$last" >>"$json"
}

# Arithmetic on decimals: calc EXPR (awk), printed with the given format.
calc() {
    awk "BEGIN { v = $2; printf \"$1\", v }" </dev/null
}

human() {
    case "$1" in
    64) echo "64 B" ;;
    4096) echo "4 KiB" ;;
    65536) echo "64 KiB" ;;
    1048576) echo "1 MiB" ;;
    16777216) echo "16 MiB" ;;
    *) echo "$1 B" ;;
    esac
}

: >"$json"
: >"$txt"
say() {
    printf '%s\n' "$*" | tee -a "$txt"
}

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
say "shmbroker benchmark, $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n): $cpu," \
    "$(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM," \
    "$(uname -sr); redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')"
say "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" \
    "(timings on a shared machine drift; compare the ratios, taken in the same run)"

# BENCH_ONLY=queues measures the broadcast queues alone (no Redis, no objects).
if [ "${BENCH_ONLY:-}" != queues ]; then
# ---- the servers -------------------------------------------------------------
sock="$tmp/shmb.sock"
start_daemon "$name" 1G "$sock"
dpid=$started

rsock="$tmp/redis.sock"
redis-server --save "" --appendonly no --port 0 --unixsocket "$rsock" --unixsocketperm 700 \
    --daemonize no --dir "$tmp" --loglevel warning --maxmemory 0 \
    >"$tmp/redis.log" 2>&1 &
rpid=$!
i=0
until [ -S "$rsock" ] && { ! command -v redis-cli >/dev/null 2>&1 ||
    redis-cli -s "$rsock" ping >/dev/null 2>&1; }; do
    i=$((i + 1))
    [ $i -lt 200 ] || die "redis-server did not start"
    sleep 0.05
done

# ---- the bare round trip (the control plane's floor) ---------------------------
for n in $clients_list; do
    run --mode rtt --clients "$n" --seconds "$secs" --label "rtt-$n" || die "rtt failed"
    eval "rtt_p50_$n=$(field "$last" p50_us)"
    eval "rtt_ops_$n=$(field "$last" ops_per_s)"
done

# ---- the matrix ------------------------------------------------------------------
if [ "${BENCH_ONLY:-}" != reads ]; then
say ""
say "Per object: shmbroker put+get = alloc, write every byte in place, commit, get, read"
say "every byte in place, release (4 requests, the release not waited for); batch ="
say "put_many/get_many/release_many of $batch objects (3 requests per $batch objects); Redis ="
say "SET + GET of the same bytes"
say "(own RESP client, same process shape, reads every byte); memcpy = the same bytes"
say "copied in the same number of processes (cold buffers). ops/s are objects per second,"
say "all clients together; latency is per object, in microseconds."
say ""
hdr=$(printf '%-7s %3s | %10s %8s %8s %8s %9s | %10s %6s | %10s %8s | %8s %6s | %6s %6s' \
    size cl "shmb ops/s" "GB/s" "p50" "p99" "p99.9" "batch op/s" "xRedis" \
    "Redis op/s" "GB/s" "memcpy" "%mcpy" "xRedis" "p50/rt")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '|\n' '-')"

for size in $sizes; do
    for n in $clients_list; do
        lbl="$size-$n"
        # Plain calls: shmb_put (alloc, commit), shmb_get, shmb_release_nowait.
        run --mode putget --release-nowait --socket "$sock" --size "$size" --clients "$n" \
            --seconds "$secs" --label "$lbl" || die "shmbroker putget $lbl failed"
        s_ops=$(field "$last" ops_per_s)
        s_gb=$(field "$last" gb_per_s)
        s_p50=$(field "$last" p50_us)
        s_p99=$(field "$last" p99_us)
        s_p999=$(field "$last" p999_us)
        s_first=$(field "$last" first_lap_ops_per_s)
        b_ops="-"
        b_x="-"
        run --mode redis --redis-socket "$rsock" --size "$size" --clients "$n" \
            --seconds "$secs" --label "$lbl" || die "redis $lbl failed"
        r_ops=$(field "$last" ops_per_s)
        r_gb=$(field "$last" gb_per_s)
        printf '%-7s %3s | %12.0f %12.0f | %12.0f %12.0f\n' "$(human "$size")" "$n" "$s_first" \
            "$s_ops" "$(field "$last" first_lap_ops_per_s)" "$r_ops" >>"$tmp/first"
        if [ "$size" -le "$batch_max_size" ]; then
            run --mode batch-putget --socket "$sock" --size "$size" --clients "$n" \
                --batch "$batch" --seconds "$secs" --label "$lbl" ||
                die "shmbroker batch $lbl failed"
            b_ops=$(calc '%.0f' "$(field "$last" ops_per_s)")
            b_x=$(calc '%.2f' "$(field "$last" ops_per_s) / $r_ops")
        fi
        run --mode memcpy --size "$size" --clients "$n" --seconds "$secs" --label "$lbl" ||
            die "memcpy $lbl failed"
        m_gb=$(field "$last" gb_per_s)
        eval "rp50=\$rtt_p50_$n"
        say "$(printf '%-7s %3s | %10.0f %8.3f %8.1f %8.1f %9.1f | %10s %6s | %10.0f %8.3f | %8.2f %5.1f%% | %6.2f %6.1f' \
            "$(human "$size")" "$n" "$s_ops" "$s_gb" "$s_p50" "$s_p99" "$s_p999" \
            "$b_ops" "$b_x" "$r_ops" "$r_gb" "$m_gb" "$(calc '%f' "100 * $s_gb / $m_gb")" \
            "$(calc '%f' "$s_ops / $r_ops")" "$(calc '%f' "$s_p50 / $rp50")")"
    done
done
say ""
say ""
say "First lap: objects/s over each run's first $(calc '%g' "$secs / 10 > 0.5 ? 0.5 : $secs / 10") s (a"
say "new process: its first requests, pages and caches), beside the warm run that follows:"
hdr=$(printf '%-7s %3s | %12s %12s | %12s %12s' size cl "shmb first" "shmb warm" "Redis first" \
    "Redis warm")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '|\n' '-')"
while IFS= read -r line; do say "$line"; done <"$tmp/first"
say ""
say "xRedis: shmbroker put+get objects/s (= bytes/s) over Redis SET+GET; %mcpy: shmbroker"
say "GB/s over memcpy GB/s; p50/rt: shmbroker's p50 per object over the bare round trip's"
say "p50 (plain calls wait for 3 round trips per object: alloc, commit, get; the release"
say "does not wait, so 3 is the floor)."
for n in $clients_list; do
    eval "say \"bare Unix-socket round trip, $n client(s): \$(calc '%.0f' \$rtt_ops_$n) round trips/s, p50 \$rtt_p50_$n us\""
done

# A cross-check of the Redis client with redis-benchmark (64 bytes, 1 client).
if command -v redis-benchmark >/dev/null 2>&1; then
    rb=$(redis-benchmark -s "$rsock" -t set,get -d 64 -c 1 -n 20000 -q 2>/dev/null |
        tr '\r' '\n' | sed -n 's/^\(SET\|GET\): \([0-9.]*\) requests per second.*/\1 \2/p' |
        tr '\n' ' ')
    say "redis-benchmark cross-check (64 B, 1 client, requests/s): ${rb:-unavailable}"
fi
fi

# ---- the new calls: puts in one round trip, reads in none ---------------------------
# put+read = shmb_put (the payload copied into the client's arena, one
# commit_at request) + shmb_read (the catalog in the mapping, validated
# copy-out, no request), a new key each time, every byte written and read;
# nowait = the same with shmb_put_nowait (no round trip waited for: the read
# finds the commit in the catalog once the daemon published it, every put
# confirmed by shmb_sync at the end); old plain = the matrix's put+get (alloc,
# commit, get, release_nowait) again, and Redis SET+GET again, in this same
# run, the cells' runs interleaved.
say ""
say "The new calls, per object: put+read = shmb_put through the arena (1 round trip) +"
say "shmb_read (0 round trips: the catalog in the mapping), every byte written and read;"
say "nowait = shmb_put_nowait + shmb_read (no round trip waited for); old = plain put+get"
say "as above (3 round trips); Redis = SET+GET. Measured again here, in this run. fast:"
say "reads served from the mapping (the rest asked the daemon), put+read's then nowait's."
say ""
hdr=$(printf '%-7s %3s | %10s %8s %8s %8s | %10s %6s | %10s %6s | %10s %6s | %6s %6s' \
    size cl "new ops/s" "GB/s" "p50" "p99" "Redis op/s" "xRedis" "nowait/s" "xRedis" \
    "old op/s" "xold" "fast" "fastnw")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '|\n' '-')"
for cell in 64:1 64:16 4096:1 4096:16 1048576:1; do
    size=${cell%%:*}
    n=${cell##*:}
    lbl="new-$size-$n"
    run --mode putread --socket "$sock" --size "$size" --clients "$n" --seconds "$secs" \
        --label "$lbl" || die "shmbroker putread $lbl failed"
    p_ops=$(field "$last" ops_per_s)
    p_gb=$(field "$last" gb_per_s)
    p_p50=$(field "$last" p50_us)
    p_p99=$(field "$last" p99_us)
    p_fast=$(field "$last" reads_fast)
    p_fb=$(field "$last" reads_fallback)
    p_first=$(field "$last" first_lap_ops_per_s)
    run --mode putread-nowait --socket "$sock" --size "$size" --clients "$n" \
        --seconds "$secs" --label "nowait-$size-$n" || die "shmbroker putread-nowait $lbl failed"
    w_ops=$(field "$last" ops_per_s)
    w_fast=$(field "$last" reads_fast)
    w_fb=$(field "$last" reads_fallback)
    run --mode redis --redis-socket "$rsock" --size "$size" --clients "$n" \
        --seconds "$secs" --label "$lbl" || die "redis $lbl failed"
    r_ops=$(field "$last" ops_per_s)
    printf '%-7s %3s | %12.0f %12.0f | %12.0f %12.0f\n' "$(human "$size")" "$n" "$p_first" \
        "$p_ops" "$(field "$last" first_lap_ops_per_s)" "$r_ops" >>"$tmp/first-new"
    run --mode putget --release-nowait --socket "$sock" --size "$size" --clients "$n" \
        --seconds "$secs" --label "old-$size-$n" || die "shmbroker putget $lbl failed"
    o_ops=$(field "$last" ops_per_s)
    say "$(printf '%-7s %3s | %10.0f %8.3f %8.1f %8.1f | %10.0f %6.2f | %10.0f %6.2f | %10.0f %6.2f | %5.1f%% %5.1f%%' \
        "$(human "$size")" "$n" "$p_ops" "$p_gb" "$p_p50" "$p_p99" "$r_ops" \
        "$(calc '%f' "$p_ops / $r_ops")" "$w_ops" "$(calc '%f' "$w_ops / $r_ops")" \
        "$o_ops" "$(calc '%f' "$p_ops / $o_ops")" \
        "$(calc '%f' "100 * $p_fast / ($p_fast + $p_fb + 0.000001)")" \
        "$(calc '%f' "100 * $w_fast / ($w_fast + $w_fb + 0.000001)")")"
done
say ""
say "First lap of the new calls (objects/s over each run's first lap, then warm):"
hdr=$(printf '%-7s %3s | %12s %12s | %12s %12s' size cl "new first" "new warm" "Redis first" \
    "Redis warm")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '|\n' '-')"
while IFS= read -r line; do say "$line"; done <"$tmp/first-new"
say ""
say "xRedis: put+read (then put_nowait+read) objects/s over Redis SET+GET objects/s (targets:"
say ">= 2 at 64 B and 4 KiB, >= 4 at 1 MiB, one client); xold: put+read over the old plain calls."

# Hot reads: each reader process reads its own 64-byte key, put before the
# clock, as fast as it can; 1, one per CPU, and 16 processes.
say ""
say "shmb_read of a hot 64 B key (one key per reader process), reads/s of all readers:"
say ""
hdr=$(printf '%7s | %12s %8s %8s | %7s | %6s' readers "reads/s" "p50 us" "p99 us" "x1" "fast")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '|\n' '-')"
read1=""
for n in $(printf '%s\n' 1 "$(nproc)" 16 | awk '!seen[$1]++'); do
    run --mode read --socket "$sock" --size 64 --clients "$n" --seconds "$secs" \
        --label "read-$n" || die "shmbroker read x$n failed"
    h_ops=$(field "$last" ops_per_s)
    [ -n "$read1" ] || read1=$h_ops
    h_fast=$(field "$last" reads_fast)
    h_fb=$(field "$last" reads_fallback)
    say "$(printf '%7s | %12.0f %8.3f %8.3f | %7.2f | %5.1f%%' "$n" "$h_ops" \
        "$(field "$last" p50_us)" "$(field "$last" p99_us)" "$(calc '%f' "$h_ops / $read1")" \
        "$(calc '%f' "100 * $h_fast / ($h_fast + $h_fb + 0.000001)")")"
done
say "x1: over 1 reader (the CPUs bound it: $(nproc) here); target >= 1,000,000 reads/s for 1 reader."

# The system calls of a read run: the same for a thousand reads as for a
# million when the hot path makes none, but a poll() per 10 ms of reading.
if command -v strace >/dev/null 2>&1; then
    for ops in 1000 1000000; do
        strace -f -c -o "$tmp/strace-$ops" "$bench" --mode read --socket "$sock" --size 64 \
            --ops "$ops" --label "strace-$ops" >/dev/null 2>&1 ||
            die "strace of a read run failed"
        eval "sys_$ops=$(awk '$NF == "total" { print $4 }' "$tmp/strace-$ops" | tail -1)"
    done
    say "system calls of a whole read run (strace -c -f: fork, connect, hello, put, then the"
    say "reads): $sys_1000 for 1,000 reads, $sys_1000000 for 1,000,000 reads"
    printf '{"mode":"strace-read","syscalls_1k":%s,"syscalls_1m":%s}\n' "${sys_1000:-0}" \
        "${sys_1000000:-0}" >>"$json"
fi

if [ "${BENCH_ONLY:-}" != reads ]; then

# ---- the same from Python, against the same servers (tests/bench/bench_python.py) ----
# The interpreter that has Debian's python3-redis and python3-numpy: $PYTHON,
# else python3, else /usr/bin/python3 when python3 is another installation.
py=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
    if "$p" -c 'import redis, numpy' >/dev/null 2>&1; then
        py=$p
        break
    fi
done
[ -n "$py" ] || py=${PYTHON:-python3}
pyquick=""
[ "${BENCH_QUICK:-0}" = 1 ] && pyquick=--quick
src=$(dirname "$0")/..
PYTHONPATH="$src/client/python${PYTHONPATH:+:$PYTHONPATH}" "$py" "$src/tests/bench/bench_python.py" \
    --socket "$sock" --redis-socket "$rsock" --json "$json" $pyquick >"$tmp/py.out" ||
    die "the Python benchmark failed"
while IFS= read -r line; do say "$line"; done <"$tmp/py.out"
# One multimodal store shared by several vLLM API servers against a store per
# server: items and bytes of shared memory held (daemons of its own).
say ""
SHMBROKERD="$daemon" PYTHONPATH="$src/client/python${PYTHONPATH:+:$PYTHONPATH}" "$py" \
    "$src/tests/bench/bench_vllm_shared.py" --json "$json" >"$tmp/mm.out" ||
    die "the shared multimodal store benchmark failed"
while IFS= read -r line; do say "$line"; done <"$tmp/mm.out"
stop_pid "$rpid"
rpid=""
stop_pid "$dpid"
dpid=""

# ---- a million live objects --------------------------------------------------------
say ""
start_daemon "$name-scale" 1G "$tmp/scale.sock"
spid=$started
extra_pids="$spid"
out=$("$bench" --mode scale --socket "$tmp/scale.sock" --size 64 --objects "$scale_objects" \
    --seconds "$secs" --label scale 2>"$tmp/run.err") || die "scale failed: $(cat "$tmp/run.err")"
printf '%s\n' "$out" | grep '^{' >>"$json"
say "$(printf '%s\n' "$out" | grep '^scale:')"
stop_pid "$spid"
extra_pids=""

# ---- how long a 4 GiB segment takes to be ready ---------------------------------
t0=$(date +%s%N)
"$daemon" --size 4G --name "$name-4g" --shm-dir /dev/shm --socket "$tmp/4g.sock" \
    --log-level warn >"$tmp/4g.log" 2>&1 &
gpid=$!
extra_pids="$gpid"
t1=$("$bench" --mode ready --socket "$tmp/4g.sock" --seconds 30) || die "4 GiB daemon not ready"
ready_ms=$(( (t1 - t0) / 1000000 ))
stop_pid "$gpid"
extra_pids=""
[ -e "/dev/shm/$name-4g" ] && say "warning: /dev/shm/$name-4g was left behind"
printf '{"mode":"ready","segment_bytes":4294967296,"ready_ms":%s}\n' "$ready_ms" >>"$json"
say "4 GiB segment: exec to first hello answered in $ready_ms ms"
fi
fi

if [ "${BENCH_ONLY:-}" = reads ]; then
    say "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
    say ""
    say "table: $txt; JSON lines: $json"
    exit 0
fi

# ---- broadcast queues (tests/bench/queue_bench.c) -------------------------------------
# One writer and 1 or 4 reader processes: a shmbroker queue through the
# library against a busy-polling ring of the queue's layout (no daemon, no
# futex), ZeroMQ PUB/SUB over ipc:// and a Unix-socket fan-out. A failed
# measurement shows as "fail" and its reason is printed under the tables. Our
# figures are what the run is for: a reference's run (spin, zmq, unix) that
# fails is run once more (said under the tables, with the first reason), and
# one that fails twice shows as "fail" without failing the run; a failed run
# of ours (shmb) is not retried and makes the script end with status 1,
# naming it in the last lines.
if [ "${BENCH_QUICK:-0}" = 1 ]; then
    qlat=0.3
    qhot=0.2
    qtput=0.2
    qidle=0.3
else
    qlat=1.5
    qhot=0.7
    qtput=1
    qidle=1
fi
qsizes="64 4096 65536 1048576"
qimpls="shmb spin zmq unix"
qfailed=0
qours=""
qrefs=""
: >"$tmp/qerr"
: >"$tmp/qretry"
: >"$tmp/qhot"
: >"$tmp/qtput"
: >"$tmp/qfirst"
qfirst_n=""
start_daemon "$name-q" 128M "$tmp/q.sock"
qpid=$started
extra_pids="$qpid"

# Why a run failed: the last lines it printed on stderr ($1), else how it
# ended (exit status $2), so that no failure is ever listed without a reason.
qreason() {
    why=$(tail -3 "$1" | tr '\n' ' ' | sed 's/ *$//')
    if [ -n "$why" ]; then
        printf '%s' "$why"
    elif [ "$2" -gt 128 ]; then
        printf 'killed by signal %s (SIG%s), nothing printed' "$(($2 - 128))" \
            "$(kill -l "$(($2 - 128))" 2>/dev/null)"
    elif [ "$2" -ne 0 ]; then
        printf 'exited with status %s, nothing printed' "$2"
    else
        printf 'exited with status 0 but printed no JSON line'
    fi
}

# Run shmb-queue-bench with the given options; the JSON line goes to $json
# and into $last; on failure $last is empty and the reason is kept. A
# reference's run is tried twice; ours once (see above).
qrun() {
    qimpl="" qlabel="" prev=""
    for a in "$@"; do
        case $prev in
        --impl) qimpl=$a ;;
        --label) qlabel=$a ;;
        esac
        prev=$a
    done
    try=1
    while :; do
        out=$("$qbench" --socket "$tmp/q.sock" "$@" 2>"$tmp/run.err")
        st=$?
        last=$(printf '%s\n' "$out" | grep '^{' | tail -1)
        if [ -n "$last" ] && [ "$st" = 0 ]; then
            printf '%s\n' "$last" >>"$json"
            return 0
        fi
        why=$(qreason "$tmp/run.err" "$st")
        if [ "$qimpl" != shmb ] && [ "$try" = 1 ]; then
            printf '%s: %s\n' "$*" "$why" >>"$tmp/qretry"
            try=2
            continue
        fi
        last=""
        if [ "$qimpl" = shmb ]; then
            qfailed=1
            qours="${qours:+$qours, }$qlabel"
            printf 'ours, %s: %s\n' "$*" "$why" >>"$tmp/qerr"
        else
            qrefs="${qrefs:+$qrefs, }$qlabel"
            printf 'reference, failed twice, %s: %s\n' "$*" "$why" >>"$tmp/qerr"
        fi
        return 1
    done
}

# A figure in a printf format, or "fail" when it was not measured.
fig() {
    if [ -n "$2" ]; then calc "$1" "$2"; else printf 'fail'; fi
}

# $2 / $3 in a printf format, or "-" when either is missing or zero.
qratio() {
    if [ -n "$2" ] && [ -n "$3" ] && awk "BEGIN { exit !($2 > 0 && $3 > 0) }"; then
        calc "$1" "$2 / $3"
    else
        printf '-'
    fi
}

# Whether a ratio ($1, as qratio printed it) meets "$2 $3" (e.g. "<= 2").
meets() {
    [ "$1" != "-" ] && awk "BEGIN { exit !($1 $2 $3) }"
}

say ""
zver=$(pkg-config --modversion libzmq 2>/dev/null)
say "Broadcast queues: 1 writer process, 1 or 4 reader processes, on $(nproc) CPUs (4 readers"
say "and the writer are 5 processes: the machine is oversubscribed, the busy-poll floor most)."
say "shmb = a shmbroker queue through the library (shmb_queue_reserve + publish, dequeue +"
say "done) of a running shmbrokerd, 10 slots of 1 MiB (vLLM's max_chunks; 1 MiB fits a slot,"
say "so every size here is inline); spin = a ring of the same layout with no daemon and no"
say "futex, each reader polling with sched_yield between polls as vLLM's shm_broadcast does"
say "(the floor, at a core per reader); zmq = ZeroMQ ${zver:-?} PUB/SUB (XPUB) over ipc://,"
say "XPUB_NODROP with SNDHWM = RCVHWM = min(1000, 64 MiB / size) messages, so a full pipe"
say "blocks the writer instead of dropping, the writer waits for every subscription before"
say "it sends (the slow joiner) and keeps its socket open until every reader has the end"
say "message (libzmq drops a lagging SUB's unread tail at the hang-up; not timed); unix = the"
say "writer sends each message to each reader's SOCK_STREAM socket in turn. Every reader"
say "checks the order and reads every byte."
say "Load average before the queues: $(cut -d' ' -f1-3 /proc/loadavg) (other processes on these"
say "CPUs move every figure here, the spinning floor's most)."
say ""
say "One-way latency, us: from the send time in the payload (CLOCK_MONOTONIC, stamped once the"
say "message is filled) to the reader having it (in place, or received into its buffer); one"
say "message in flight, at most one every 200 us (1 MiB: every 1024 us), all readers' messages"
say "together. p50/spin and p50/zmq: shmb's p50 over theirs (targets <= 2 and <= 0.10)."
say ""
hdr=$(printf '%-7s %2s | %8s %8s %8s | %8s %8s %8s | %8s %8s %8s | %8s %8s %8s | %8s %7s' \
    size rd "shmb p50" p99 p99.9 "spin p50" p99 p99.9 "zmq p50" p99 p99.9 \
    "unix p50" p99 p99.9 p50/spin p50/zmq)
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '|\n' '-')"
for size in $qsizes; do
    for n in 1 4; do
        for impl in $qimpls; do
            for v in p50 p99 p999 h50 h99 h999 tput gbs; do eval "q_${impl}_$v="; done
            lbl="$impl-$size-$n"
            if qrun --impl "$impl" --run latency --size "$size" --readers "$n" \
                --seconds "$qlat" --label "$lbl"; then
                eval "q_${impl}_p50=$(field "$last" p50_us)"
                eval "q_${impl}_p99=$(field "$last" p99_us)"
                eval "q_${impl}_p999=$(field "$last" p999_us)"
            fi
            if qrun --impl "$impl" --run latency --period-us 0 --size "$size" --readers "$n" \
                --seconds "$qhot" --label "$lbl-b2b"; then
                eval "q_${impl}_h50=$(field "$last" p50_us)"
                eval "q_${impl}_h99=$(field "$last" p99_us)"
                eval "q_${impl}_h999=$(field "$last" p999_us)"
            fi
            if qrun --impl "$impl" --run throughput --size "$size" --readers "$n" \
                --seconds "$qtput" --label "$lbl"; then
                eval "q_${impl}_tput=$(field "$last" msgs_per_s)"
                qfirst_n=$(field "$last" first_lap_msgs)
                printf '%s\n' "$(human "$size") x$n $impl $(calc '%.0f' \
                    "$(field "$last" first_lap_msgs_per_s)")" >>"$tmp/qfirst"
                eval "q_${impl}_gbs=$(field "$last" gb_per_s)"
                lost=$(field "$last" lost)
                [ "$lost" = 0 ] || printf '%s\n' "$impl $(human "$size") x$n: $lost messages lost" \
                    >>"$tmp/qerr"
            fi
        done
        eval "floor_${size}_$n=\$q_spin_p50"
        r_floor=$(qratio '%.2f' "$q_shmb_p50" "$q_spin_p50")
        r_zmq=$(qratio '%.3f' "$q_shmb_p50" "$q_zmq_p50")
        h_floor=$(qratio '%.2f' "$q_shmb_h50" "$q_spin_h50")
        h_zmq=$(qratio '%.3f' "$q_shmb_h50" "$q_zmq_h50")
        x_zmq=$(qratio '%.2f' "$q_shmb_tput" "$q_zmq_tput")
        say "$(printf '%-7s %2s | %8s %8s %8s | %8s %8s %8s | %8s %8s %8s | %8s %8s %8s | %8s %7s' \
            "$(human "$size")" "$n" \
            "$(fig '%.1f' "$q_shmb_p50")" "$(fig '%.1f' "$q_shmb_p99")" "$(fig '%.1f' "$q_shmb_p999")" \
            "$(fig '%.1f' "$q_spin_p50")" "$(fig '%.1f' "$q_spin_p99")" "$(fig '%.1f' "$q_spin_p999")" \
            "$(fig '%.1f' "$q_zmq_p50")" "$(fig '%.1f' "$q_zmq_p99")" "$(fig '%.1f' "$q_zmq_p999")" \
            "$(fig '%.1f' "$q_unix_p50")" "$(fig '%.1f' "$q_unix_p99")" "$(fig '%.1f' "$q_unix_p999")" \
            "$r_floor" "$r_zmq")"
        # The back-to-back and throughput tables are printed after this one.
        printf '%-7s %2s | %8s %8s %8s | %8s %8s %8s | %8s %8s %8s | %8s %8s %8s | %8s %7s\n' \
            "$(human "$size")" "$n" \
            "$(fig '%.1f' "$q_shmb_h50")" "$(fig '%.1f' "$q_shmb_h99")" "$(fig '%.1f' "$q_shmb_h999")" \
            "$(fig '%.1f' "$q_spin_h50")" "$(fig '%.1f' "$q_spin_h99")" "$(fig '%.1f' "$q_spin_h999")" \
            "$(fig '%.1f' "$q_zmq_h50")" "$(fig '%.1f' "$q_zmq_h99")" "$(fig '%.1f' "$q_zmq_h999")" \
            "$(fig '%.1f' "$q_unix_h50")" "$(fig '%.1f' "$q_unix_h99")" "$(fig '%.1f' "$q_unix_h999")" \
            "$h_floor" "$h_zmq" >>"$tmp/qhot"
        printf '%-7s %2s | %10s %7s | %10s | %10s | %10s | %6s %6s %6s\n' \
            "$(human "$size")" "$n" "$(fig '%.0f' "$q_shmb_tput")" "$(fig '%.3f' "$q_shmb_gbs")" \
            "$(fig '%.0f' "$q_spin_tput")" "$(fig '%.0f' "$q_zmq_tput")" \
            "$(fig '%.0f' "$q_unix_tput")" "$x_zmq" \
            "$(qratio '%.2f' "$q_shmb_tput" "$q_spin_tput")" \
            "$(qratio '%.2f' "$q_shmb_tput" "$q_unix_tput")" >>"$tmp/qtput"
        cell="$(human "$size") x$n"
        for t in floor zmq hfloor hzmq tput; do
            case $t in
            floor) r=$r_floor; cmp="<= 2" ;;
            zmq) r=$r_zmq; cmp="<= 0.10" ;;
            hfloor) r=$h_floor; cmp="<= 2" ;;
            hzmq) r=$h_zmq; cmp="<= 0.10" ;;
            tput) r=$x_zmq; cmp=">= 1" ;;
            esac
            eval "n_$t=\$((\${n_$t:-0} + 1))"
            if meets "$r" $cmp; then
                eval "met_$t=\$((\${met_$t:-0} + 1))"
            elif [ "$r" = - ]; then
                eval "none_$t=\"\${none_$t:+\$none_$t, }$cell\""
            else
                eval "miss_$t=\"\${miss_$t:+\$miss_$t, }$cell ($r)\""
            fi
        done
    done
done
say ""
say "The same, one message in flight back to back: the next as soon as every reader has the"
say "last (the writer polls for it), so readers are never idle for long."
say ""
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '|\n' '-')"
while IFS= read -r line; do say "$line"; done <"$tmp/qhot"
say ""
say "Messages/s back to back: messages sent / the time until the last reader had the last one"
say "(a writer held back by a full queue or a full socket is part of it); GB/s: shmb's bytes"
say "per second to each reader. xzmq, xspin, xunix: shmb's messages/s over theirs (target:"
say "xzmq >= 1)."
say ""
hdr=$(printf '%-7s %2s | %10s %7s | %10s | %10s | %10s | %6s %6s %6s' \
    size rd "shmb msg/s" GB/s "spin msg/s" "zmq msg/s" "unix msg/s" xzmq xspin xunix)
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '|\n' '-')"
while IFS= read -r line; do say "$line"; done <"$tmp/qtput"
say ""
say "First lap of each throughput run (messages/s over its first ${qfirst_n:-?} messages, a new"
say "process's first pass over every slot, untimed in the table above):"
awk '{ k = $1 " " $2 " " $3; if (k != prev) { if (line != "") print line; line = "  " k ":"; prev = k }
       line = line " " $4 "=" $5 } END { if (line != "") print line }' "$tmp/qfirst" |
    while IFS= read -r line; do say "$line"; done

say ""
say "Idle readers: CPU seconds per reader (getrusage of the reader processes, all threads) over"
say "$qidle s of waiting for a message that comes at the end; 64-byte messages."
say ""
hdr=$(printf '%-9s | %10s %10s %10s %10s' readers shmb spin zmq unix)
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '|\n' '-')"
for n in 1 4; do
    for impl in $qimpls; do
        eval "q_${impl}_cpu="
        if qrun --impl "$impl" --run idle --size 64 --readers "$n" --seconds "$qidle" \
            --label "$impl-idle-$n"; then
            eval "q_${impl}_cpu=$(field "$last" cpu_s_per_reader)"
        fi
    done
    say "$(printf '%-9s | %10s %10s %10s %10s' "$n" "$(fig '%.4f' "$q_shmb_cpu")" \
        "$(fig '%.4f' "$q_spin_cpu")" "$(fig '%.4f' "$q_zmq_cpu")" "$(fig '%.4f' "$q_unix_cpu")")"
    eval "q_idle_$n=\$q_shmb_cpu"
done

# Readers that spin before they sleep: the latency of a busy-polling reader
# while messages come at least every spin, and no CPU once they stop.
qspin=1000
say ""
say "shmb with readers spinning up to $qspin us before they sleep (shmb_queue_set_spin; Python"
say "MessageQueue.set_spin): one-way latency at the first table's pace, the CPU seconds per"
say "reader over that run ($qlat s), and p50 over the busy-poll floor's p50 from the first table."
say ""
hdr=$(printf '%-7s %2s | %8s %8s %8s | %8s | %8s' size rd "shmb p50" p99 p99.9 "cpu s" p50/spin)
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '|\n' '-')"
for size in $qsizes; do
    for n in 1 4; do
        s50= s99= s999= scpu=
        if qrun --impl shmb --run latency --spin-us "$qspin" --size "$size" --readers "$n" \
            --seconds "$qlat" --label "shmb-spin$qspin-$size-$n"; then
            s50=$(field "$last" p50_us)
            s99=$(field "$last" p99_us)
            s999=$(field "$last" p999_us)
            scpu=$(field "$last" cpu_s_per_reader)
        fi
        eval "fl=\$floor_${size}_$n"
        r=$(qratio '%.2f' "$s50" "$fl")
        n_sfloor=$((${n_sfloor:-0} + 1))
        if meets "$r" "<=" 2; then
            met_sfloor=$((${met_sfloor:-0} + 1))
        elif [ "$r" = - ]; then
            none_sfloor="${none_sfloor:+$none_sfloor, }$(human "$size") x$n"
        else
            miss_sfloor="${miss_sfloor:+$miss_sfloor, }$(human "$size") x$n ($r)"
        fi
        say "$(printf '%-7s %2s | %8s %8s %8s | %8s | %8s' "$(human "$size")" "$n" \
            "$(fig '%.1f' "$s50")" "$(fig '%.1f' "$s99")" "$(fig '%.1f' "$s999")" \
            "$(fig '%.3f' "$scpu")" "$r")"
    done
done
for n in 1 4; do
    q_sidle=
    if qrun --impl shmb --run idle --spin-us "$qspin" --size 64 --readers "$n" \
        --seconds "$qidle" --label "shmb-spin$qspin-idle-$n"; then
        q_sidle=$(field "$last" cpu_s_per_reader)
    fi
    say "idle, $n reader(s), spinning up to $qspin us: $(fig '%.4f' "$q_sidle") CPU s per reader over $qidle s"
done
stop_pid "$qpid"
extra_pids=""

say ""
say "Targets (shmb against the others, at each size and reader count; the ratio where missed):"
say "  p50 <= 2x the busy-poll floor, paced: met in ${met_floor:-0} of ${n_floor:-0}${miss_floor:+; missed at $miss_floor}${none_floor:+; no figure at $none_floor (a run failed)}"
say "  p50 <= 2x the busy-poll floor, paced, readers spinning up to $qspin us: met in ${met_sfloor:-0} of ${n_sfloor:-0}${miss_sfloor:+; missed at $miss_sfloor}${none_sfloor:+; no figure at $none_sfloor (a run failed)}"
say "  p50 <= 2x the busy-poll floor, back to back: met in ${met_hfloor:-0} of ${n_hfloor:-0}${miss_hfloor:+; missed at $miss_hfloor}${none_hfloor:+; no figure at $none_hfloor (a run failed)}"
say "  p50 <= 1/10 of ZeroMQ's, paced: met in ${met_zmq:-0} of ${n_zmq:-0}${miss_zmq:+; missed at $miss_zmq}${none_zmq:+; no figure at $none_zmq (a run failed)}"
say "  p50 <= 1/10 of ZeroMQ's, back to back: met in ${met_hzmq:-0} of ${n_hzmq:-0}${miss_hzmq:+; missed at $miss_hzmq}${none_hzmq:+; no figure at $none_hzmq (a run failed)}"
say "  messages/s >= ZeroMQ's: met in ${met_tput:-0} of ${n_tput:-0}${miss_tput:+; missed at $miss_tput}${none_tput:+; no figure at $none_tput (a run failed)}"
say "  idle CPU per reader: $(fig '%.4f' "$q_idle_1") s (1 reader), $(fig '%.4f' "$q_idle_4") s (4 readers)" \
    "over $qidle s, where the floor's readers use what the CPUs have"
if [ -s "$tmp/qretry" ]; then
    say ""
    say "Queue benchmark runs of a reference retried once (their first failure; the table has the"
    say "second try, or fail):"
    while IFS= read -r line; do say "  $line"; done <"$tmp/qretry"
fi
if [ -s "$tmp/qerr" ]; then
    say ""
    say "Queue benchmark failures:"
    while IFS= read -r line; do say "  $line"; done <"$tmp/qerr"
fi

# ---- vLLM's own classes side by side (tests/bench/bench_vllm.py) ------------------------
# Run when vLLM is importable or VLLM_SRC names its source tree; else one line
# says how. Its rows go to $build/bench/vllm.json, its table here.
src=$(dirname "$0")/..
vpy=${PYTHON:-python3}
vjson="$build/bench/vllm.json"
mkdir -p "$build/bench"
say ""
if [ -n "${VLLM_SRC:-}" ] || "$vpy" -c 'import vllm' >/dev/null 2>&1; then
    : >"$vjson"
    if SHMBROKERD="$daemon" PYTHONPATH="$src/client/python${PYTHONPATH:+:$PYTHONPATH}" \
        "$vpy" "$src/tests/bench/bench_vllm.py" --json "$vjson" >"$tmp/vllm.out"; then
        while IFS= read -r line; do say "$line"; done <"$tmp/vllm.out"
    else
        qfailed=1
        say "vLLM side by side: tests/bench/bench_vllm.py failed (its error is above)"
    fi
else
    say "vLLM side by side: not run, no vLLM here (VLLM_SRC=/path/to/vllm make bench-vllm)"
    vjson="" # an earlier run's figures are not this run's: no vllm.svg from them
fi

# ---- charts (scripts/bench_charts.py), from this run's JSON ---------------------------
if "$vpy" -c 'import matplotlib' >/dev/null 2>&1; then
    say ""
    "$vpy" "$src/scripts/bench_charts.py" "$build/bench" --results "$json" ${vjson:+--vllm "$vjson"} \
        >"$tmp/charts.out" || qfailed=1
    while IFS= read -r line; do say "$line"; done <"$tmp/charts.out"
else
    say "charts: not drawn, matplotlib is missing (sh scripts/install-deps.sh bench)"
fi
say "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
say ""
say "table: $txt; JSON lines: $json; charts: $build/bench/*.svg"
[ -z "$qrefs" ] ||
    say "reference runs that failed twice (fail in the tables; they do not fail the run): $qrefs"
[ -z "$qours" ] || say "FAILED: our queue runs $qours (reasons under the queue tables)"
[ "$qfailed" = 0 ] || exit 1
