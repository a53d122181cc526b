# SPDX-License-Identifier: Apache-2.0
"""shmbroker's Python benchmark: put+get from Python, one process writing and
another reading, against what a Python user would use instead, in one run.

    python3 tests/bench/bench_python.py --socket SHMB_SOCKET --redis-socket REDIS_SOCKET
                                        [--quick] [--json FILE]

scripts/bench.sh runs it after the C table, against the same shmbrokerd and
redis-server. Each measurement forks a writer and a reader that work in
lock-step: the writer puts object i and sends i (8 bytes) down a pipe, the
reader gets object i, reads every byte (a numpy sum of it as 64-bit words,
checked against the sum the writer's bytes must give) and answers on a second
pipe, and only then does the writer put object i+1. So one op is one put and
one get, with one pipe message each way, and every system pays the same two
messages (the "sync" row measures them alone). multiprocessing.Queue carries
the object itself down its pipe instead of the 8 bytes, and answers on the
same second pipe.

The systems:
  shmb get    Client.put(key, data); Client.get(key), the bytes read in place
              through the pin's view (zero-copy), pin.release(noreply=True)
              (the C table's shmb_release_nowait)
  shmb read   Client.put(key, data); Client.read(key) (copies out, releases)
  shmb with   (64 B) as shmb get, the pin released by leaving a `with` block
  shmb batch  (64 B) Client.put_many of 16 objects, one message, get_many,
              release_many
  redis-py    SET + GET over the Unix socket (python3-redis, its pure-Python
              reply parser: Debian installs python3-hiredis only on request)
  redis mset  (64 B) MSET + MGET of 16 objects, the batch's counterpart
  mp.Queue    multiprocessing.Queue.put(data) / get() (pickle over a pipe)
  shm copy    multiprocessing.shared_memory: the writer copies the bytes into
              a slot of a ring of shared memory (a single-writer store such as
              vLLM's), the reader reads them in place; the floor
  sync        the two pipe messages alone

The writer's data is a bytearray it stamps with i before each put. Rounds
run every measurement once, in a rotating order, and the figures are the
median over the rounds: ops/s and us per op of each, and the ratios taken
within each round (so that a slow moment of the shared machine divides out).
Prints the table on stdout and, with --json, one JSON line per measurement.
Nothing here asserts a timing.
"""
import argparse
import json
import multiprocessing
import os
import statistics
import struct
import sys
import time
import traceback

try:
    import numpy as np
except ImportError:  # the bench then reads every byte with zlib.adler32
    np = None

SIZES_FULL = (64, 1 << 20, 16 << 20)
BATCH = 16
STOP = (1 << 64) - 1
WORD = 0x5A5A5A5A5A5A5A5A  # the writer's bytes, 0x5a, as 64-bit words
RING_SPAN = 128 << 20  # the shm ring: cold buffers, as a store's ring has

# The targets: (size, system the ratio is against, at least).
TARGETS = (
    (1 << 20, "redis-py", 5.0), (1 << 20, "mp.Queue", 5.0),
    (16 << 20, "redis-py", 5.0), (16 << 20, "mp.Queue", 5.0),
    (64, "redis-py", 1.0),
)


def human(size):
    """64 -> '64 B', 1048576 -> '1 MiB'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return "%d %s" % (size >> shift, unit)
    return "%d B" % size


# ---- reading every byte, the same way for every system ----------------------

def make_checker(size):
    """Returns check(buf, seq): reads every byte of buf and raises unless it is
    exactly the writer's object number seq. numpy sums the bytes as 64-bit
    words at memory speed; without numpy, zlib.adler32 reads them (slower, the
    same for every system)."""
    words = size // 8
    if np is not None and size % 8 == 0:
        base = ((words - 1) * WORD) & STOP

        def check(buf, seq):
            total = int(np.frombuffer(buf, dtype=np.uint64, count=words).sum())
            if total != (base + seq) & STOP:
                raise RuntimeError("object %d of %d bytes: wrong bytes (sum %#x)"
                                   % (seq, size, total))
        return check

    import zlib
    cache = {}

    def check_adler(buf, seq):
        if len(buf) != size:
            raise RuntimeError("object %d: %d bytes, not %d" % (seq, len(buf), size))
        got = zlib.adler32(buf)
        if seq not in cache:
            cache.clear()
            cache[seq] = zlib.adler32(stamped(size, seq))
        if got != cache[seq]:
            raise RuntimeError("object %d of %d bytes: wrong bytes" % (seq, size))
    return check_adler


def stamped(size, seq, into=None):
    """The writer's object number seq: 0x5a bytes, the first 8 being seq."""
    buf = into if into is not None else bytearray(b"\x5a" * size)
    struct.pack_into("<Q", buf, 0, seq)
    return buf


# ---- the systems: setup in the parent, a writer and a reader in children ----
#
# Each system is a class with:
#   prepare(size)           in the parent, before the fork (shared objects)
#   writer(size) -> put     in the writer child: put(seq) stores object seq
#   reader(size) -> get     in the reader child: get(seq, check) reads it
#   finish()                in the parent, after both children ended
# `per_op` is how many objects one put/get moves (16 for the batches).

class Sync:
    """The lock-step's own cost: the two pipe messages, no object."""
    name = "sync"
    per_op = 1
    small_only = False  # True: measured at 64 B only

    def __init__(self, args):
        self.args = args

    def prepare(self, size):
        pass

    def writer(self, size):
        return lambda seq: None

    def reader(self, size):
        return lambda seq, check: None

    def finish(self):
        pass


class ShmCopy(Sync):
    """multiprocessing.shared_memory: copy into a ring slot, read in place."""
    name = "shm copy"

    def prepare(self, size):
        from multiprocessing import shared_memory
        self.slots = max(2, RING_SPAN // size)
        self.shm = shared_memory.SharedMemory(create=True, size=self.slots * size)
        touch_pages(self.shm.buf, write=True)

    def writer(self, size):
        buf, slots = self.shm.buf, self.slots
        touch_pages(buf, write=True)  # this process's page tables, off the clock
        src = stamped(size, 0)

        def put(seq):
            stamped(size, seq, src)
            off = (seq % slots) * size
            buf[off:off + size] = src
        return put

    def reader(self, size):
        buf, slots = self.shm.buf, self.slots
        touch_pages(buf, write=False)

        def get(seq, check):
            off = (seq % slots) * size
            with buf[off:off + size] as view:
                check(view, seq)
        return get

    def finish(self):
        self.shm.close()
        self.shm.unlink()


def touch_pages(buf, write):
    """One byte of every page of buf, so that page faults happen before the
    clock starts (the shmbroker client maps its segment with MAP_POPULATE)."""
    if np is not None:
        a = np.frombuffer(buf, dtype=np.uint8)
        if write:
            a[::4096] = 0x5A
        else:
            int(a[::4096].sum())
        del a
    else:
        for off in range(0, len(buf), 4096):
            if write:
                buf[off] = 0x5A
            else:
                buf[off]


class MpQueue(Sync):
    """multiprocessing.Queue: the object pickled down a pipe."""
    name = "mp.Queue"

    def prepare(self, size):
        self.q = multiprocessing.get_context("fork").Queue()

    def writer(self, size):
        src = stamped(size, 0)
        q = self.q

        def put(seq):
            q.put(stamped(size, seq, src))
        return put

    def reader(self, size):
        q = self.q

        def get(seq, check):
            check(q.get(), seq)
        return get

    def finish(self):
        self.q.close()


class Redis(Sync):
    """redis-py: SET and GET of one key (Redis replaces the value in place)."""
    name = "redis-py"

    def connect(self):
        import redis
        return redis.Redis(unix_socket_path=self.args.redis_socket)

    def writer(self, size):
        r = self.connect()
        key = "pybench:%d" % os.getppid()
        src = stamped(size, 0)
        view = memoryview(src)

        def put(seq):
            stamped(size, seq, src)
            r.set(key, view)
        return put

    def reader(self, size):
        r = self.connect()
        key = "pybench:%d" % os.getppid()

        def get(seq, check):
            check(r.get(key), seq)
        return get


class RedisBatch(Redis):
    """redis-py: MSET and MGET of 16 keys."""
    name = "redis mset"
    per_op = BATCH
    small_only = True

    def writer(self, size):
        r = self.connect()
        keys = ["pybench:%d:%d" % (os.getppid(), j) for j in range(BATCH)]
        srcs = [stamped(size, 0) for _ in range(BATCH)]
        views = [memoryview(s) for s in srcs]
        mapping = dict(zip(keys, views))

        def put(seq):
            for j, s in enumerate(srcs):
                stamped(size, seq * BATCH + j, s)
            r.mset(mapping)
        return put

    def reader(self, size):
        r = self.connect()
        keys = ["pybench:%d:%d" % (os.getppid(), j) for j in range(BATCH)]

        def get(seq, check):
            for j, value in enumerate(r.mget(keys)):
                check(value, seq * BATCH + j)
        return get


class Shmb(Sync):
    """shmbroker's Python client: put(); get() read in place through the
    pin's view, released without awaiting the answer (as the C table's
    shmb_release_nowait)."""
    name = "shmb get"

    def connect(self, role):
        import shmbroker
        return shmbroker.Client(self.args.socket, name="pybench-" + role)

    def prepare(self, size):
        # Keys unique to this measurement: a put never meets an older object.
        Shmb.run_id = getattr(Shmb, "run_id", 0) + 1
        self.prefix = "pyb%d-%d-" % (os.getpid(), Shmb.run_id)

    def writer(self, size):
        c = self.connect("writer")
        src = stamped(size, 0)
        prefix = self.prefix

        def put(seq):
            c.put(prefix + str(seq), stamped(size, seq, src))
        return put

    def reader(self, size):
        c = self.connect("reader")
        prefix = self.prefix

        def get(seq, check):
            pin = c.get(prefix + str(seq))
            check(pin.view, seq)
            pin.release(noreply=True)
        return get


class ShmbWith(Shmb):
    """The same, with the pin released by leaving a ``with`` block (a noreply
    release, as release(noreply=True))."""
    name = "shmb with"
    small_only = True

    def reader(self, size):
        c = self.connect("reader")
        prefix = self.prefix

        def get(seq, check):
            with c.get(prefix + str(seq)) as pin:
                check(pin.view, seq)
        return get


class ShmbRead(Shmb):
    """shmbroker's Python client: put(); read() copies the bytes out."""
    name = "shmb read"

    def reader(self, size):
        c = self.connect("reader")
        prefix = self.prefix

        def get(seq, check):
            check(c.read(prefix + str(seq)), seq)
        return get


class ShmbBatch(Shmb):
    """shmbroker's Python client: put_many, get_many and release_many of 16
    objects."""
    name = "shmb batch"
    per_op = BATCH
    small_only = True

    def writer(self, size):
        c = self.connect("writer")
        srcs = [stamped(size, 0) for _ in range(BATCH)]
        prefix = self.prefix

        def put(seq):
            items = []
            for j, s in enumerate(srcs):
                n = seq * BATCH + j
                items.append((prefix + str(n), stamped(size, n, s)))
            for res in c.put_many(items):
                if isinstance(res, Exception):
                    raise res
        return put

    def reader(self, size):
        c = self.connect("reader")
        prefix = self.prefix

        def get(seq, check):
            keys = [prefix + str(seq * BATCH + j) for j in range(BATCH)]
            pins = c.get_many(keys)
            for j, pin in enumerate(pins):
                if isinstance(pin, Exception):
                    raise pin
                check(pin.view, seq * BATCH + j)
            c.release_many(keys)
        return get


# ---- one measurement: a writer and a reader in lock-step ------------------------

def read_exact(fd, n):
    """n bytes from a pipe; EOFError when the other side is gone."""
    data = os.read(fd, n)
    while len(data) < n:
        more = os.read(fd, n - len(data))
        if not more:
            raise EOFError("the other process ended")
        data += more
    return data


def writer_main(system, size, seconds, note_w, ack_r, result_w):
    """The writer child: a few untimed ops, then put/notify/wait for seconds."""
    out = {}
    try:
        put = system.writer(size)
        read_exact(ack_r, 1)  # the reader is connected and ready
        seq = 0
        # The untimed first lap: a new process's first objects, reported apart.
        first = time.perf_counter()
        warm_until = first + min(0.05, seconds / 4)
        while seq < 2 or time.perf_counter() < warm_until:
            put(seq)
            os.write(note_w, struct.pack("<Q", seq))
            read_exact(ack_r, 1)
            seq += 1
        first = {"first_ops": seq * system.per_op, "first_seconds": time.perf_counter() - first}
        ops = 0
        start = time.perf_counter()
        end = start + seconds
        while True:
            put(seq)
            os.write(note_w, struct.pack("<Q", seq))
            read_exact(ack_r, 1)
            seq += 1
            ops += 1
            now = time.perf_counter()
            if now >= end and ops >= 3:
                break
        out = dict(first, ops=ops * system.per_op, seconds=now - start)
        os.write(note_w, struct.pack("<Q", STOP))
    except BaseException:
        out = {"error": "writer: " + traceback.format_exc()}
    os.write(result_w, json.dumps(out).encode() + b"\n")
    os.close(result_w)


def reader_main(system, size, note_r, ack_w, result_w):
    """The reader child: wait for an object number, get it, read it, answer."""
    out = {}
    try:
        check = make_checker(size)
        get = system.reader(size)
        os.write(ack_w, b"r")
        while True:
            (seq,) = struct.unpack("<Q", read_exact(note_r, 8))
            if seq == STOP:
                break
            get(seq, check)
            os.write(ack_w, b"a")
    except BaseException:
        out = {"error": "reader: " + traceback.format_exc()}
    os.write(result_w, json.dumps(out).encode() + b"\n")
    os.close(result_w)


def measure(system, size, seconds):
    """Fork a writer and a reader, run them, return {"ops", "seconds"}."""
    system.prepare(size)
    ctx = multiprocessing.get_context("fork")
    note_r, note_w = os.pipe()
    ack_r, ack_w = os.pipe()
    res_r, res_w = os.pipe()
    fds = (note_r, note_w, ack_r, ack_w, res_r, res_w)
    keep_w = (note_w, ack_r, res_w)
    keep_r = (note_r, ack_w, res_w)

    def child(keep, fn, *a):
        for fd in fds:
            if fd not in keep:
                os.close(fd)
        fn(*a)

    try:
        w = ctx.Process(target=child, args=(keep_w, writer_main, system, size, seconds,
                                            note_w, ack_r, res_w))
        r = ctx.Process(target=child, args=(keep_r, reader_main, system, size,
                                            note_r, ack_w, res_w))
        r.start()
        w.start()
    finally:
        for fd in fds:
            if fd != res_r:
                os.close(fd)
    results = []
    with os.fdopen(res_r, "rb") as f:
        for line in f:  # EOF once both children ended
            results.append(json.loads(line))
    for p in (w, r):
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()
    system.finish()
    errors = [x["error"] for x in results if "error" in x]
    if errors:
        raise RuntimeError("%s, %s: %s" % (system.name, human(size), "\n".join(errors)))
    got = [x for x in results if "ops" in x]
    if len(got) != 1:
        raise RuntimeError("%s, %s: the writer reported nothing (exit codes %s, %s)"
                           % (system.name, human(size), w.exitcode, r.exitcode))
    return got[0]


# ---- the run -----------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True, help="shmbrokerd's socket")
    ap.add_argument("--redis-socket", help="redis-server's Unix socket")
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("--rounds", type=int, help="rounds of every measurement")
    ap.add_argument("--seconds", type=float, help="length of one measurement")
    ap.add_argument("--sizes", help="comma-separated sizes in bytes")
    ap.add_argument("--systems", help="comma-separated system names (default: all)")
    ap.add_argument("--json", help="append one JSON line per measurement to this file")
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)
    seconds = args.seconds or (0.15 if args.quick else 0.4)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else SIZES_FULL

    missing = []
    systems = [Sync, ShmCopy, MpQueue]
    import importlib.util
    if importlib.util.find_spec("redis") is not None:
        if args.redis_socket:
            systems += [Redis, RedisBatch]
        else:
            missing.append("redis-py (no --redis-socket)")
    else:
        missing.append("redis-py (python3-redis is not installed)")
    try:
        import shmbroker  # noqa: F401
        systems += [Shmb, ShmbRead, ShmbWith]
        if hasattr(shmbroker.Client, "put_many"):
            systems.append(ShmbBatch)
    except ImportError as e:
        missing.append("shmbroker (%s)" % e)
    if args.systems:
        wanted = args.systems.split(",")
        systems = [s for s in systems if s.name in wanted]
    jsonf = open(args.json, "a") if args.json else None

    # Every (size, system) pair, once per round, in an order that rotates.
    cells = [(size, cls) for size in sizes for cls in systems
             if not cls.small_only or size <= 64]
    found = {}  # (size, name) -> list of {"ops", "seconds"} per round
    for rnd in range(rounds):
        print("bench_python: round %d of %d" % (rnd + 1, rounds), file=sys.stderr, flush=True)
        k = rnd * len(cells) // rounds
        for size, cls in cells[k:] + cells[:k]:
            res = measure(cls(args), size, seconds)
            res["round"] = rnd
            found.setdefault((size, cls.name), []).append(res)
            if jsonf:
                jsonf.write(json.dumps({
                    "mode": "python", "system": cls.name, "size": size, "round": rnd,
                    "objects": res["ops"], "seconds": round(res["seconds"], 6),
                    "ops_per_s": round(res["ops"] / res["seconds"], 1),
                    "first_lap_ops_per_s": round(res["first_ops"] / res["first_seconds"], 1)},
                    separators=(",", ":")) + "\n")
                jsonf.flush()
    report(found, sizes, rounds, seconds, missing)


def rate(res):
    return res["ops"] / res["seconds"]


def report(found, sizes, rounds, seconds, missing):
    """The table, the ratios and the targets."""
    def med(size, name):
        runs = found.get((size, name))
        return statistics.median(rate(x) for x in runs) if runs else None

    def ratio(size, a, b):
        """Median over rounds of a/b measured in the same round, and the range."""
        ra = {x["round"]: rate(x) for x in found.get((size, a), [])}
        rb = {x["round"]: rate(x) for x in found.get((size, b), [])}
        rs = [ra[k] / rb[k] for k in ra if k in rb]
        if not rs:
            return None
        return statistics.median(rs), min(rs), max(rs)

    def us(size, name):
        v = med(size, name)
        return "%9.1f" % (1e6 / v) if v else "%9s" % "-"

    def x(r):
        return "%6.2f" % r[0] if r else "%6s" % "-"

    def xs(r):
        return "%.2fx" % r[0] if r else "-"

    say = print
    how = "a numpy sum as 64-bit words" if np is not None else "zlib.adler32, numpy absent"
    say("")
    say("Python: one writer process and one reader process in lock-step: the writer")
    say("puts object i and sends i down a pipe; the reader gets it, reads every byte")
    say("(%s, checked against what was written)" % how)
    say("and answers on a second pipe. us = microseconds per put+get, op/s = put+get")
    say("pairs per second; medians of %d rounds of %.2f s, the systems interleaved;"
        % (rounds, seconds))
    say("ratios are medians of the ratios taken within each round. shmb get: put(),")
    say("get() read in place through the pin's view, release(noreply=True); shmb read:")
    say("put(), read() (a copy); redis-py: SET + GET; mp.Queue: put() and get() of the")
    say("bytes (pickled down its pipe, which carries them instead of i); shm copy: the")
    say("bytes copied into a ring in multiprocessing.shared_memory and read in place")
    say("(the floor); sync: the two pipe messages alone, part of every other figure.")
    for m in missing:
        say("not measured: " + m)
    say("")
    names = ("shmb get", "shmb read", "redis-py", "mp.Queue", "shm copy", "sync")
    hdr = "%-6s | %9s %8s | %9s %9s %9s %9s %9s | %6s %6s %6s | %6s %6s" % (
        "size", "shmb get", "op/s", "shmb read", "redis-py", "mp.Queue", "shm copy",
        "sync", "xRedis", "xQueue", "%floor", "rd:xR", "rd:xQ")
    say(hdr)
    say("".join(c if c == "|" else "-" for c in hdr))
    for size in sizes:
        g = med(size, "shmb get")
        fl = ratio(size, "shmb get", "shm copy")
        say("%-6s | %s %8s | %s | %s %s %6s | %s %s" % (
            human(size), us(size, "shmb get"), "%.0f" % g if g else "-",
            " ".join(us(size, n) for n in names[1:]),
            x(ratio(size, "shmb get", "redis-py")), x(ratio(size, "shmb get", "mp.Queue")),
            "%5.0f%%" % (100 * fl[0]) if fl else "-",
            x(ratio(size, "shmb read", "redis-py")), x(ratio(size, "shmb read", "mp.Queue"))))
    if 64 in sizes:
        def per_obj(name):
            v = med(64, name)
            return "%.0f/s, %.1f us" % (v, 1e6 / v) if v else "-"
        say("64 B, reader leaving `with client.get(key) as pin:` (a release that awaits no")
        say("answer): %s per put+get, %s redis-py."
            % (per_obj("shmb with"), xs(ratio(64, "shmb with", "redis-py"))))
        say("64 B in batches of %d, one pipe message each way per batch, per object:"
            % BATCH)
        say("shmb put_many + get_many + release_many %s; redis-py MSET + MGET %s;"
            % (per_obj("shmb batch"), per_obj("redis mset")))
        say("shmb batch over redis-py MSET/MGET %s, over plain SET/GET %s."
            % (xs(ratio(64, "shmb batch", "redis mset")), xs(ratio(64, "shmb batch", "redis-py"))))
    firsts = []
    for size in sizes:
        for name in names[:3]:
            runs = found.get((size, name))
            if runs:
                firsts.append("%s %s %.0f" % (human(size), name, statistics.median(
                    x["first_ops"] / x["first_seconds"] for x in runs)))
    say("First lap (op/s over each writer's first ~50 ms, untimed above): " + "; ".join(firsts))
    say("xRedis, xQueue: shmb get's op/s over redis-py's, over mp.Queue's; %floor: shmb")
    say("get's op/s over shm copy's; rd:xR, rd:xQ: the same for shmb read.")
    say("")
    say("Targets (issue 12), shmb get and shmb read against each, median [range]:")
    for size, against, want in TARGETS:
        parts = []
        for name in ("shmb get", "shmb read"):
            r = ratio(size, name, against)
            if r:
                parts.append("%s %.2fx [%.2f-%.2f] %s" % (
                    name, r[0], r[1], r[2], "met" if r[0] >= want else "MISSED"))
        say("  %-6s >= %gx %-8s: %s" % (human(size), want, against,
                                        "; ".join(parts) or "not measured"))


if __name__ == "__main__":
    sys.exit(main())
