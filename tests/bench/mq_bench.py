# SPDX-License-Identifier: Apache-2.0
"""shmbroker.MessageQueue from Python, one writer process and N reader
processes: messages/s back to back, one-way latency and the readers' CPU
when paced, and the readers' CPU once messages stop.

    python3 tests/bench/mq_bench.py [--readers 1,4] [--sizes 64,4096,65536,1048576]
                                    [--kind bytes|numpy|dict] [--impl shmbroker|FILE.py]

--impl FILE.py measures another MessageQueue class of vLLM's interface
(MessageQueue(n_reader, n_local_reader, max_chunk_bytes=, max_chunks=),
export_handle, create_from_handle, wait_until_ready, enqueue, dequeue),
loaded from that file, side by side. Starts a private shmbrokerd
($SHMBROKERD, else build/shmbrokerd). The machine's load shows in every
figure (each line ends with the 1-minute load average): run it on a quiet
machine, several times, interleaved with the other class.
"""

import argparse
import importlib.util
import multiprocessing as mp
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

CTX = mp.get_context("fork")


def load_impl(impl):
    if impl == "shmbroker":
        import shmbroker
        return shmbroker.MessageQueue
    spec = importlib.util.spec_from_file_location("mq_other", impl)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.MessageQueue


def make_message(kind, size, stamp=0):
    if kind == "bytes":
        b = bytearray(size)
        b[:8] = stamp.to_bytes(8, "little")
        return bytes(b)
    if kind == "numpy":
        import numpy as np
        a = np.zeros(max(1, size // 8), dtype=np.int64)
        a[0] = stamp
        return a
    return {"step": stamp, "data": bytes(size)}


def stamp_of(kind, msg):
    if kind == "bytes":
        return int.from_bytes(msg[:8], "little")
    if kind == "numpy":
        return int(msg[0])
    return msg["step"]


_COUNTS = {"wait": 0, "wake": 0}


def count_futex():
    """Count this process's futex waits and wakes (MQ_BENCH_COUNT_FUTEX=1)
    from zero; wrapped once (a reader forked from a counting writer would
    otherwise count each call twice)."""
    from shmbroker import _futex
    _COUNTS.update(wait=0, wake=0)
    if getattr(_futex.futex_wait, "counted", False):
        return
    wait, wake = _futex.futex_wait, _futex.futex_wake

    def counted_wait(*a):
        _COUNTS["wait"] += 1
        return wait(*a)

    def counted_wake(*a):
        _COUNTS["wake"] += 1
        return wake(*a)
    counted_wait.counted = True
    _futex.futex_wait, _futex.futex_wake = counted_wait, counted_wake


def reader(cls, handle, rank, count, kind, paced, out):
    if os.environ.get("MQ_BENCH_COUNT_FUTEX"):
        count_futex()
    mq = cls.create_from_handle(handle, rank)
    mq.wait_until_ready()
    lat = []
    mq.dequeue()  # the warm-up message
    t0 = os.times()
    w0 = time.monotonic()
    for _ in range(count):
        m = mq.dequeue()
        if paced:
            lat.append(time.monotonic_ns() - stamp_of(kind, m))
    end = time.monotonic()
    t1 = os.times()
    busy = (t1.user + t1.system - t0.user - t0.system) / max(end - w0, 1e-9)
    # Idle: the writer sends nothing for 1 s, then one last message.
    i0 = os.times()
    mq.dequeue()
    i1 = os.times()
    idle = i1.user + i1.system - i0.user - i0.system
    if os.environ.get("MQ_BENCH_COUNT_FUTEX"):
        area = getattr(mq, "_area", None)
        print("  reader %d: %d futex waits, %d wakes for %d messages; %s"
              % (rank, _COUNTS["wait"], _COUNTS["wake"], count,
                 {k: getattr(area, k, None) for k in ("naps", "sleeps", "_gap", "_dev", "_lead")}),
              flush=True)
    out.put((rank, end, lat, busy, idle, t1.user + t1.system - t0.user - t0.system))
    time.sleep(0.2)


def load_average():
    """The machine's 1-minute load average, which every figure moves with."""
    try:
        return "%.2f" % os.getloadavg()[0]
    except OSError:
        return "unknown"


def run(cls, readers, size, kind, count, paced_us, slot, slots):
    mq = cls(readers, readers, max_chunk_bytes=slot, max_chunks=slots)
    handle = mq.export_handle()
    out = CTX.Queue()
    procs = [CTX.Process(target=reader, args=(cls, handle, r, count, kind, paced_us, out))
             for r in range(readers)]
    for p in procs:
        p.start()
    mq.wait_until_ready()
    msg = make_message(kind, size)
    mq.enqueue(msg)
    time.sleep(0.1)
    start = time.monotonic()
    w0 = os.times()
    if paced_us:
        gap = paced_us * 1000
        nxt = time.monotonic_ns()
        for _ in range(count):
            nxt += gap
            while time.monotonic_ns() < nxt:
                pass
            mq.enqueue(make_message(kind, size, time.monotonic_ns()))
    else:
        for _ in range(count):
            mq.enqueue(msg)
    w1 = os.times()
    time.sleep(1.0)
    mq.enqueue(msg)
    res = [out.get(timeout=120) for _ in procs]
    if os.environ.get("MQ_BENCH_COUNT_FUTEX"):
        print("  writer: %d futex waits, %d wakes" % (_COUNTS["wait"], _COUNTS["wake"]),
              flush=True)
        _COUNTS.update(wait=0, wake=0)
    for p in procs:
        p.join(10)
    end = max(r[1] for r in res)
    lat = sorted(x for r in res for x in r[2])
    busy = statistics.mean(r[3] for r in res)
    idle = max(0.0, statistics.mean(r[4] for r in res))  # no "-0.000"
    # CPU of the writer and every reader per message (microseconds).
    cpu_us = (w1.user + w1.system - w0.user - w0.system + sum(r[5] for r in res)) / count * 1e6
    try:
        mq.close()
    except AttributeError:
        pass
    return count / (end - start), lat, busy, idle, cpu_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--readers", default="1,4")
    ap.add_argument("--sizes", default="64,4096,65536,1048576")
    ap.add_argument("--kind", default="bytes")
    ap.add_argument("--impl", default="shmbroker")
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--paced-us", type=int, default=200)
    ap.add_argument("--paced-count", type=int, default=5000)
    ap.add_argument("--slot", type=int, default=24 << 20)
    ap.add_argument("--slots", type=int, default=10)
    ap.add_argument("--only", default="both", choices=("both", "b2b", "paced"))
    a = ap.parse_args()
    daemon = None
    if a.impl == "shmbroker" and not os.environ.get("SHMBROKER_SOCKET"):
        import support
        daemon = support.Daemon("64M", ["--max-queue-bytes", "2G"]).start()
        os.environ["SHMBROKER_SOCKET"] = daemon.socket_path
    cls = load_impl(a.impl)
    if os.environ.get("MQ_BENCH_COUNT_FUTEX"):
        count_futex()
    try:
        for n in [int(x) for x in a.readers.split(",")]:
            for size in [int(x) for x in a.sizes.split(",")]:
                count = max(200, min(a.count, a.count * 4096 // max(size, 4096)))
                line = "%-10s %8d B %d readers" % (a.kind, size, n)
                if a.only in ("both", "b2b"):
                    rate, _, busy, _, cpu_us = run(cls, n, size, a.kind, count, 0, a.slot,
                                                   a.slots)
                    line += "  b2b %10.0f msg/s (%6.1f CPU-us/msg)" % (rate, cpu_us)
                if a.only in ("both", "paced"):
                    gap = a.paced_us if size < (1 << 20) else max(a.paced_us, 2000)
                    pc = max(200, min(a.paced_count, a.paced_count * 65536 // max(size, 65536)))
                    _, lat, busy, idle, _ = run(cls, n, size, a.kind, pc, gap, a.slot, a.slots)
                    line += ("  paced/%dus p50 %7.1f us p99 %7.1f us  reader CPU %.3f s/s"
                             "  idle 1 s CPU %.3f s"
                             % (gap, lat[len(lat) // 2] / 1000, lat[len(lat) * 99 // 100] / 1000,
                                busy, idle))
                print(line + "  load %s" % load_average(), flush=True)
    finally:
        if daemon is not None:
            daemon.cleanup()


if __name__ == "__main__":
    main()
