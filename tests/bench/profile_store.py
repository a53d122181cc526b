# SPDX-License-Identifier: Apache-2.0
"""Where the store drop-in's put and get spend their time, in bench_vllm's
store pattern: one writer and one reader process in lock-step (put, hand the
pair over a pipe, get, answer), a 1 GiB ring touched by both first.

Each named step is timed by wrapping it (perf_counter_ns around the call,
nested steps inside their callers' figures; a wrap costs about 0.3 us), and
reported in microseconds per pair, beside put's and get's wall and CPU
(thread_time) time. A figure of a wrapped step is its own process's: the
writer's for put's steps, the reader's for get's.

Usage: SHMBROKERD=build/shmbrokerd python3 tests/bench/profile_store.py
[--cell 64KiB|1MiB|dict] [--pairs N] [--steps put,get,none] [--ring-mib M]
[--one-cpu] [--import torch]
Nothing here asserts a timing.
"""

import argparse
import collections
import functools
import multiprocessing
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_vllm as B  # noqa: E402  (puts the package on the path)

# The steps timed, as (module, class or None, function); nested ones count
# inside their callers too.
PUT_STEPS = [("_wire", "Wire", "_send"), ("_puts", "Puts", "_commit_at"),
             ("_puts", "Puts", "_arena_reply"), ("_puts", "Puts", "_take_due_arena"),
             ("_arena", "Arena", "write"), ("vllm", None, "_write_pieces"),
             ("_puts", "Puts", "_put_arena"), ("_puts", "Puts", "_publish_held"),
             ("_puts", "Puts", "_publish"), ("vllm", "ShmBrokerObjectStorage", "_put_made"),
             ("_arena", "Arena", "publish"),
             ("vllm", "ShmBrokerObjectStorage", "_put_through"),
             ("vllm", "ShmBrokerObjectStorage", "_tell_guard"),
             ("vllm", "ShmBrokerObjectStorage", "_start_guard"),
             ("_reads", "Reads", "_listed"), ("vllm", "ShmBrokerObjectStorage", "_prune"),
             ("vllm", "ShmBrokerObjectStorage", "_settle_base"),
             ("_vllm_serde", "PickleSerde", "serialize")]
GET_STEPS = [("vllm", "ShmBrokerObjectStorage", "_get_mapped"),
             ("_vllm_serde", "PickleSerde", "deserialize"),
             ("vllm", "ShmBrokerObjectStorage", "_abs"),
             ("_vllm_index", "StoreIndex", "_mapped"), ("_reads", "Reads", "_count_in_place"),
             ("_wire", "Wire", "_exchange_line")]
SPENT = collections.defaultdict(int)
CALLS = collections.defaultdict(int)


def wrap(steps):
    """Time each step's calls into SPENT and CALLS."""
    import importlib
    clock = time.perf_counter_ns
    for mod, cls, name in steps:
        owner = importlib.import_module("shmbroker." + mod)
        owner = getattr(owner, cls) if cls else owner
        real = getattr(owner, name, None)
        if real is None:
            continue  # not in this version of the package
        label = "%s.%s" % (cls or mod, name)

        @functools.wraps(real)
        def timed(*args, _real=real, _label=label, **kw):
            t = clock()
            try:
                return _real(*args, **kw)
            finally:
                SPENT[_label] += clock() - t
                CALLS[_label] += 1
        setattr(owner, name, timed)
    if any(name == "_get_mapped" for _m, _c, name in steps):
        real_yield = os.sched_yield

        def counted_yield():
            CALLS["sched_yield (commit not landed yet)"] += 1
            SPENT["sched_yield (commit not landed yet)"] += 0
            real_yield()
        os.sched_yield = counted_yield


def daemon_load(pid):
    """The store's private daemon's (voluntary context switches, CPU clock
    ticks) so far: how often it was woken, and what it spent."""
    with open("/proc/%d/status" % pid) as f:
        woken = next(int(line.split()[1]) for line in f
                     if line.startswith("voluntary_ctxt_switches"))
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return woken, int(fields[11]) + int(fields[12])


def report(who, pairs):
    for label in sorted(SPENT, key=lambda k: -SPENT[k]):
        print("%s %-44s %9.1f us/pair %8d calls" % (who, label, SPENT[label] / pairs / 1e3,
                                                   CALLS[label]))


def reader(handle, conn, steps):
    wrap(GET_STEPS if "get" in steps else [])
    store = B.ours_side().store.create_from_handle(handle)
    B.touch(store.ring_buffer.shared_memory.buf)
    conn.send("ready")
    n = 0
    while True:
        msg = conn.recv()
        if msg is None:
            break
        if msg == "start":
            SPENT.clear()
            CALLS.clear()
            n = 0
            continue
        t, c = time.perf_counter_ns(), time.thread_time_ns()
        store.get(*msg)
        SPENT["get (wall)"] += time.perf_counter_ns() - t
        SPENT["get (cpu)"] += time.thread_time_ns() - c
        n += 1
        conn.send_bytes(b"k")
    report("get", max(n, 1))
    sys.stdout.flush()
    conn.send("done")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", choices=("64KiB", "1MiB", "dict"), default="64KiB")
    ap.add_argument("--pairs", type=int, default=3000)
    ap.add_argument("--steps", default="put,get", help="put, get, both or none")
    ap.add_argument("--ring-mib", type=int, default=1024, help="the ring's size (MiB)")
    ap.add_argument("--one-cpu", action="store_true",
                    help="the writer, its private daemon and the reader on one CPU")
    ap.add_argument("--import", dest="imports", default="",
                    help="modules to import first, comma-separated (torch: as in a vLLM "
                         "process, and in bench_vllm's)")
    opts = ap.parse_args()
    for name in filter(None, opts.imports.split(",")):
        __import__(name)
    if opts.one_cpu:
        # Before the store: its daemon and the reader inherit the CPU.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    kind, size = {"64KiB": ("bytes", 64 << 10), "1MiB": ("bytes", B.MIB),
                  "dict": ("dict", B.MIB)}[opts.cell]
    side = B.ours_side()
    ring = max(opts.ring_mib, 64) * B.MIB
    store = side.make_store(ring, ring // 4, multiprocessing.Lock())
    here, there = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=reader, args=(store.handle(), there, opts.steps))
    proc.start()
    wrap(PUT_STEPS if "put" in opts.steps else [])
    B.touch(store.ring_buffer.shared_memory.buf)
    here.recv()
    values = [B.payload(kind, size, i) for i in range(4)]
    key = 0

    def lap(n):
        nonlocal key
        t0 = time.perf_counter()
        for _ in range(n):
            key += 1
            t, c = time.perf_counter_ns(), time.thread_time_ns()
            pair = store.put("k%d" % key, values[key & 3])
            SPENT["put (wall)"] += time.perf_counter_ns() - t
            SPENT["put (cpu)"] += time.thread_time_ns() - c
            here.send(pair)
            here.recv_bytes()
        return n / (time.perf_counter() - t0)

    here.send("start")
    lap(max(1, opts.pairs // 3))  # untimed
    SPENT.clear()
    CALLS.clear()
    here.send("start")
    daemon = store.ring_buffer.daemon
    before = daemon_load(daemon.pid) if daemon is not None else None
    rate = lap(opts.pairs)
    print("%s: %d pairs/s in lock-step (load %s)" % (opts.cell, rate,
                                                    " ".join("%.2f" % x for x in
                                                             os.getloadavg())))
    print("cpus: writer %s, daemon %s, reader %s" % tuple(
        sorted(os.sched_getaffinity(pid)) if pid is not None else "-"
        for pid in (0, daemon.pid if daemon is not None else None, proc.pid)))
    if before is not None:
        after = daemon_load(daemon.pid)
        print("daemon: %.2f wake-ups and %.1f us of CPU a pair" % (
            (after[0] - before[0]) / opts.pairs,
            (after[1] - before[1]) * 1e6 / os.sysconf("SC_CLK_TCK") / opts.pairs))
    report("put", opts.pairs)
    sys.stdout.flush()
    here.send(None)
    here.recv()
    proc.join(60)
    store.close()


if __name__ == "__main__":
    main()
