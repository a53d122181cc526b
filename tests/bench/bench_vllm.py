# SPDX-License-Identifier: Apache-2.0
"""vLLM's own shared-memory classes side by side with shmbroker's drop-ins.

vLLM's SingleWriterShmObjectStorage / SingleWriterShmRingBuffer
(vllm/distributed/device_communicators/shm_object_storage.py) against
shmbroker.vllm's, and vLLM's MessageQueue (shm_broadcast.py) against
shmbroker.MessageQueue, through the calls vLLM makes, in rounds that
alternate the two (vLLM, ours, vLLM, ours...). Each cell's figure is the
ratio ours/vLLM taken within a round; the report gives the median of those
ratios and their spread (lowest..highest), beside each side's median.

vLLM comes from an installed vllm package, or from a source tree named by
VLLM_SRC (the two files are loaded from it; what they import from vllm.*
for logging, settings and addresses is stood in for here). With neither,
the script says how to get one and exits with status 2. --against-ours
runs shmbroker's classes on both sides: a check of this script's own
logic that needs no vLLM (its ratios are about 1).

Warm memory: each process touches every page of its mapping of the ring
(ring.shared_memory.buf, an attribute both sides have) before the clock
starts, and one untimed lap of the whole ring follows (a store's daemon
meets each chunk header in its own mapping there, as it has in a store that
has run a while); the lap before that, on cold pages, is reported on a line
of its own ("first lap"), since a short-lived process does pay it. The 64 KiB
cell is measured once more with the writer and the reader pinned to one CPU
("64 KiB one CPU"): what a pair costs without the scheduler's choice of one
CPU or two, which swings a lock-step's rate several times over here.

Usage: SHMBROKERD=build/shmbrokerd VLLM_SRC=/path/to/vllm python3
tests/bench/bench_vllm.py [--quick] [--rounds N] [--seconds S] [--only store|queue]
[--json FILE]
Nothing here asserts a timing.
"""

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import ipaddress
import json
import logging
import mmap
import multiprocessing
import os
import pickle
import socket
import statistics
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

STORE_MODULE = "vllm.distributed.device_communicators.shm_object_storage"
QUEUE_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
GET_VLLM = ("Install vLLM (pip install vllm) in this Python, or name a vLLM source tree: "
            "git clone https://github.com/vllm-project/vllm /path/to/vllm, then "
            "VLLM_SRC=/path/to/vllm make bench-vllm.")

MIB = 1 << 20
QUEUE_CHUNK = 24 * MIB  # vLLM's default geometry for its broadcast queue
QUEUE_CHUNKS = 10


# ---- vLLM from a source tree ---------------------------------------------------------

def _open_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What the two files import from vllm.* and use when run on one host: the
# rest of any stand-in module is a placeholder class per name.
_STANDIN_NAMES = {
    "init_logger": logging.getLogger,
    "get_ip": lambda: "127.0.0.1",
    "get_open_port": _open_port,
    "get_open_zmq_ipc_path": lambda: "ipc://%s/vllm-bench-%d-%s" % (
        tempfile.gettempdir(), os.getpid(), os.urandom(6).hex()),
    "is_valid_ipv6_address": lambda a: isinstance(_ip(a), ipaddress.IPv6Address),
    "VLLM_RINGBUFFER_WARNING_INTERVAL": 60,
}


def _ip(address):
    try:
        return ipaddress.ip_address(address)
    except ValueError:
        return None


class _StandinModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in _STANDIN_NAMES:
            return _STANDIN_NAMES[name]
        if self.__name__ == "vllm.envs" and name.startswith("VLLM_"):
            return None
        value = type(name, (), {})
        setattr(self, name, value)
        return value


class _VllmTreeFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """vllm.* from VLLM_SRC: the two measured files as they are, every other
    module a stand-in (vLLM's package __init__ would import all of vLLM)."""

    def __init__(self, src):
        self.files = {
            STORE_MODULE: os.path.join(src, *STORE_MODULE.split(".")) + ".py",
            QUEUE_MODULE: os.path.join(src, *QUEUE_MODULE.split(".")) + ".py",
        }

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.files:
            return importlib.util.spec_from_file_location(fullname, self.files[fullname])
        if fullname == "vllm" or fullname.startswith("vllm."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandinModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def load_vllm(src):
    """(store module, queue module) of vLLM, from src or the installed package;
    raises SystemExit(2) with how to get one when neither is there."""
    if src:
        finder = _VllmTreeFinder(src)
        missing = [f for f in finder.files.values() if not os.path.isfile(f)]
        if missing:
            print("bench_vllm: VLLM_SRC=%s is not a vLLM source tree: %s is missing. %s"
                  % (src, missing[0], GET_VLLM), file=sys.stderr)
            sys.exit(2)
        sys.meta_path.insert(0, finder)
    try:
        import importlib
        store = importlib.import_module(STORE_MODULE)
        queue = importlib.import_module(QUEUE_MODULE)
    except ImportError as e:
        where = "VLLM_SRC=%s" % src if src else "no VLLM_SRC and no vllm package"
        print("bench_vllm: cannot load vLLM's classes (%s): %s. %s" % (where, e, GET_VLLM),
              file=sys.stderr)
        sys.exit(2)
    return store, queue


class Side:
    """One side of the comparison: its ring, store and queue classes and the
    serde its store is given."""

    def __init__(self, name, ring, store, queue, serde=None):
        self.name, self.ring, self.store, self.queue, self.serde = name, ring, store, queue, serde

    def make_store(self, ring_bytes, max_object, lock):
        ring = self.ring(ring_bytes, create=True)
        kw = {"reader_lock": lock}
        if self.serde is not None:
            kw["serde_class"] = self.serde
        return self.store(max_object, 1, ring, **kw)


def vllm_side(store_mod, queue_mod):
    # vLLM's default MsgpackSerde needs vllm.v1.serial_utils; for everything
    # but tensors and multimodal items it pickles the value in band with
    # HIGHEST_PROTOCOL and a (type name, size, None) header: the same here.
    class PickleInBand(store_mod.ObjectSerde):
        def serialize(self, value):
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            md = pickle.dumps(("bytes", len(data), None), protocol=pickle.HIGHEST_PROTOCOL)
            return data, len(data), md, len(md)

        def deserialize(self, view):
            _, nbytes, _ = pickle.loads(view)
            return pickle.loads(view[-nbytes:])

    return Side("vllm", store_mod.SingleWriterShmRingBuffer,
                store_mod.SingleWriterShmObjectStorage, queue_mod.MessageQueue, PickleInBand)


def ours_side():
    import shmbroker
    import shmbroker.vllm
    return Side("ours", shmbroker.vllm.SingleWriterShmRingBuffer,
                shmbroker.vllm.SingleWriterShmObjectStorage, shmbroker.MessageQueue)


# ---- shared helpers --------------------------------------------------------------------

def touch(buf):
    """Fault in every page of a mapping, reading one byte of each."""
    view = memoryview(buf).cast("B")
    s = 0
    for off in range(0, len(view), 4096):
        s += view[off]
    return s


def cpu_of(pid):
    """CPU seconds (user + system, every thread) of a process so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def payload(kind, size, i):
    if kind == "dict":
        import numpy
        return {"pixel_values": numpy.full(MIB // 4, i, dtype=numpy.float32), "index": i}
    return bytes([i & 0xFF]) * size


# ---- the store: one writer, one reader, in lock-step -----------------------------------

STORE_CELLS = [("bytes", 64 << 10), ("bytes", MIB), ("bytes", 16 * MIB), ("dict", MIB)]
# The cell measured once more with the writer and the reader on one CPU.
ONE_CPU_CELL = ("bytes", 64 << 10)


def cell_name(kind, size):
    return "dict+1MiB-array" if kind == "dict" else human(size)


def human(size):
    for unit, n in (("MiB", MIB), ("KiB", 1024)):
        if size >= n and size % n == 0:
            return "%d %s" % (size // n, unit)
    return "%d B" % size


def memcpy_reference(seconds):
    """The copies a 1 MiB object's put and get cannot do without, timed in
    this process: microseconds to copy 1 MiB into memory mapped and touched
    but not in the cache (a new place each time, as a ring's), and out of
    such memory into a new bytearray (as a get that copies). (in, out)."""
    span = 64 * MIB  # twice this VM's last-level cache: each place is cold again
    m = mmap.mmap(-1, span)
    view = memoryview(m)
    try:
        for off in range(0, span, 4096):
            view[off] = 1  # written: a page only read maps the zero page
        src = bytes(range(256)) * (MIB // 256)
        clock = time.perf_counter
        out = []
        for copy in (lambda at: view.__setitem__(slice(at, at + MIB), src),
                     lambda at: bytearray(view[at:at + MIB])):
            n, t0, at = 0, clock(), 0
            while n < 20 or clock() - t0 < seconds:
                copy(at)
                at = (at + MIB) % span
                n += 1
            out.append((clock() - t0) / n * 1e6)
        return tuple(out)
    finally:
        view.release()
        m.close()


def timer_reference(seconds):
    """What a timed wake-up costs in this process: the median microseconds
    a sleep of 150 us and of 4.8 ms ends late, with the thread's timer
    slack at 1 us (as a reader's nap sets it). A reader that sleeps until
    just ahead of its next message is that late, on an idle CPU, before it
    can poll. (150 us, 4.8 ms)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30
    old = libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
    libc.prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    out = []
    try:
        for want in (150e-6, 4.8e-3):
            late, t_end = [], time.monotonic() + seconds
            while len(late) < 20 or time.monotonic() < t_end:
                t0 = time.perf_counter()
                time.sleep(want)
                late.append((time.perf_counter() - t0 - want) * 1e6)
            out.append(statistics.median(late))
    finally:
        if old > 0:
            libc.prctl(PR_SET_TIMERSLACK, old, 0, 0, 0)
    return tuple(out)


def store_reader(side, handle, conn):
    """Get each pair the writer sends, timing the get() alone; "gets" sends
    the seconds and the count of the gets since the last "gets"."""
    store = side.store.create_from_handle(handle)
    clock = time.perf_counter
    spent, n = 0.0, 0
    while True:
        msg = conn.recv()
        if msg is None:
            break
        if msg == "touch":
            touch(store.ring_buffer.shared_memory.buf)
            conn.send("touched")
            continue
        if msg == "gets":
            conn.send((spent, n))
            spent, n = 0.0, 0
            continue
        if type(msg) is tuple and msg[0] == "cpus":
            os.sched_setaffinity(0, msg[1])
            conn.send("pinned")
            continue
        address, monotonic_id = msg
        t = clock()
        store.get(address, monotonic_id)
        spent += clock() - t
        n += 1
        conn.send_bytes(b"k")
    conn.close()


def store_writer(side, opts, out):
    """Open a store, then per cell: a cold first lap, the mapping touched by
    both processes, the measured pairs. Sends the figures to out."""
    res = {}
    fa = tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="bench-vllm-fallocate-")
    t = time.perf_counter()
    os.posix_fallocate(fa.fileno(), 0, opts.ring)
    res["fallocate_s"] = time.perf_counter() - t
    fa.close()
    lock = multiprocessing.Lock()
    t = time.perf_counter()
    store = side.make_store(opts.ring, opts.max_object, lock)
    res["open_s"] = time.perf_counter() - t
    here, there = multiprocessing.Pipe()
    reader = multiprocessing.Process(target=store_reader, args=(side, store.handle(), there),
                                     daemon=True)
    reader.start()
    there.close()
    key = 0
    try:
        for kind, size in STORE_CELLS:
            values = [payload(kind, size, i) for i in range(4)]

            def pairs(n=None, seconds=None):
                """Pairs per second, and the mean microseconds spent inside
                put() here and inside get() in the reader."""
                nonlocal key
                clock = time.perf_counter
                done, spent, t0 = 0, 0.0, clock()
                here.send("gets")
                here.recv()
                while (n is not None and done < n) or (
                        seconds is not None and clock() - t0 < seconds):
                    key += 1
                    t = clock()
                    pair = store.put("k%d" % key, values[key & 3])
                    spent += clock() - t
                    here.send(pair)
                    here.recv_bytes()
                    done += 1
                rate = done / (clock() - t0)
                here.send("gets")
                got, gets = here.recv()
                return rate, spent / max(done, 1) * 1e6, got / max(gets, 1) * 1e6

            name = cell_name(kind, size)
            res["first:" + name] = pairs(n=max(2, min(50, opts.ring // size // 4)))[0]
            touch(store.ring_buffer.shared_memory.buf)
            here.send("touch")
            here.recv()
            # Untimed: one whole lap of the ring, so that every process the
            # pair goes through has met each page it uses (a daemon's own
            # first touch of a chunk header costs it ~12 us on a VM, as
            # the writer's and reader's would), as a store that has run a
            # while has: the first lap is the line above.
            pairs(n=opts.ring // size + 1)
            res[name], res["put_us:" + name], res["get_us:" + name] = pairs(seconds=opts.secs)
            if (kind, size) == ONE_CPU_CELL:
                # Again with the writer and the reader on one CPU: left to
                # the scheduler, a lock-step pair runs on one CPU in some
                # rounds and on two in others (a wake-up across vCPUs costs
                # tens of us here), which swings either side's rate several
                # times over; on one CPU a pair costs what put and get cost.
                cpus = os.sched_getaffinity(0)
                one = {min(cpus)}
                os.sched_setaffinity(0, one)
                here.send(("cpus", one))
                here.recv()
                try:
                    pairs(seconds=opts.secs / 5)  # untimed
                    one_name = name + " one CPU"
                    (res[one_name], res["put_us:" + one_name],
                     res["get_us:" + one_name]) = pairs(seconds=opts.secs)
                finally:
                    os.sched_setaffinity(0, cpus)
                    here.send(("cpus", cpus))
                    here.recv()
        # What bounds the 1 MiB cells in this process: the copy into the ring
        # and the copy out of it, each side's own (ratios about 1).
        res["memcpy_us:1 MiB in"], res["memcpy_us:1 MiB out"] = memcpy_reference(opts.secs / 5)
    finally:
        here.send(None)
        reader.join(60)
        close = getattr(store.ring_buffer, "close", None)
        if close:
            close()
    out.send(res)


# ---- the queue: one writer, 1 or 4 readers --------------------------------------------

QUEUE_SIZES = [64, 4096, 64 << 10, MIB]
PACED = [(64, 200e-6), (4096, 200e-6), (64, 5e-3), (4096, 5e-3)]
DATA, PACE, REPORT, QUIT = 0, 1, 2, 3
READER_TIMEOUT = 120  # seconds a reader waits for a message before it gives up


def queue_reader(side, handle, rank, conn):
    mq = side.queue.create_from_handle(handle, rank)
    mq.wait_until_ready()
    lat, got, first_cpu, first_t = [], 0, None, None
    while True:
        # Bounded: a reader whose writer died (vLLM's would spin on) ends.
        kind, seq, t_ns, body = mq.dequeue(timeout=READER_TIMEOUT)
        now = time.monotonic_ns()
        if kind == DATA:
            got += 1
        elif kind == PACE:
            if first_cpu is None:
                first_cpu, first_t = time.process_time(), time.monotonic()
            lat.append((now - t_ns) / 1000.0)
        elif kind == REPORT:
            cpu = (time.process_time() - first_cpu) / (time.monotonic() - first_t) \
                if first_cpu is not None else 0.0
            conn.send((got, now, lat, cpu))
            lat, got, first_cpu = [], 0, None
        else:
            break
    conn.close()


def queue_writer(side, opts, n_readers, out):
    res = {}
    mq = side.queue(n_readers, n_readers, max_chunk_bytes=QUEUE_CHUNK, max_chunks=QUEUE_CHUNKS)
    handle = mq.export_handle()
    pipes, readers = [], []
    for rank in range(n_readers):
        here, there = multiprocessing.Pipe()
        p = multiprocessing.Process(target=queue_reader, args=(side, handle, rank, there),
                                    daemon=True)
        p.start()
        there.close()
        pipes.append(here)
        readers.append(p)
    mq.wait_until_ready()

    def report():
        mq.enqueue((REPORT, 0, 0, b""))
        return [c.recv() for c in pipes]

    def cpu_now():
        return time.process_time() + sum(cpu_of(p.pid) for p in readers)

    def b2b(size, n=None, seconds=None):
        """Messages per second, and the CPU microseconds the writer and
        every reader spent per message (spinning or not)."""
        body = bytes(size)
        cpu0 = cpu_now()
        sent, t0 = 0, time.monotonic_ns()
        while (n is not None and sent < n) or (
                seconds is not None and time.monotonic_ns() - t0 < seconds * 1e9):
            mq.enqueue((DATA, sent, 0, body))
            sent += 1
        got = report()
        end = max(g[1] for g in got)
        return sent / ((end - t0) / 1e9), (cpu_now() - cpu0) / sent * 1e6

    try:
        for size in opts.queue_sizes:
            name = "%s x%d" % (human(size), n_readers)
            res["first:" + name] = b2b(size, n=20)[0]
            b2b(size, seconds=opts.secs / 5)  # untimed
            res[name], res["cpu-us/msg:" + name] = b2b(size, seconds=opts.secs)
        for size, period in opts.paced:
            name = "%s x%d every %g us" % (human(size), n_readers, period * 1e6)
            body = bytes(size)
            n = max(20, int(opts.secs / period))
            nxt = time.monotonic()
            for i in range(n):
                nxt += period
                while True:
                    left = nxt - time.monotonic()
                    if left <= 0:
                        break
                    if left > 0.0005:
                        time.sleep(left - 0.0004)
                mq.enqueue((PACE, i, time.monotonic_ns(), body))
            got = report()
            lat = [x for g in got for x in g[2]]
            res["p50:" + name] = pct(lat, 0.50)
            res["p99:" + name] = pct(lat, 0.99)
            res["cpu:" + name] = statistics.mean(g[3] for g in got)
        if opts.paced:
            # What bounds a paced reader that sleeps between messages: how
            # late a timed wake-up comes on this machine (each side's own).
            res["timer_late_us:150 us x%d" % n_readers], \
                res["timer_late_us:4800 us x%d" % n_readers] = timer_reference(opts.secs / 5)
        # Idle: the readers' CPU in the first second after the last message.
        before = [cpu_of(p.pid) for p in readers]
        time.sleep(opts.idle)
        after = [cpu_of(p.pid) for p in readers]
        res["idle cpu x%d" % n_readers] = statistics.mean(
            (a - b) / opts.idle for a, b in zip(after, before))
    finally:
        mq.enqueue((QUIT, 0, 0, b""))
        for p in readers:
            p.join(30)
    out.send(res)


# ---- rounds and the report --------------------------------------------------------------

def in_child(target, *args):
    here, there = multiprocessing.Pipe(duplex=False)
    p = multiprocessing.Process(target=target, args=args + (there,))
    p.start()
    there.close()
    try:
        res = here.recv()
    except EOFError:
        p.join()
        raise RuntimeError("%s failed (exit status %s); its error is above"
                           % (target.__name__, p.exitcode))
    p.join()
    return res


def run_round(side, opts):
    res = {}
    saved = os.environ.get("SHMBROKER_SOCKET")
    if opts.only in (None, "store"):
        # The store starts a private daemon, as a vLLM writer alone would.
        os.environ["SHMBROKER_SOCKET"] = os.path.join(opts.tmp, "no-daemon.sock")
        try:
            res.update({"store " + k: v for k, v in in_child(store_writer, side, opts).items()})
        finally:
            os.environ["SHMBROKER_SOCKET"] = opts.queue_socket or saved or ""
    else:
        os.environ["SHMBROKER_SOCKET"] = opts.queue_socket or saved or ""
    for n in (opts.readers if opts.only in (None, "queue") else ()):
        res.update({"queue " + k: v for k, v in in_child(queue_writer, side, opts, n).items()})
    if saved is None:
        os.environ.pop("SHMBROKER_SOCKET", None)
    else:
        os.environ["SHMBROKER_SOCKET"] = saved
    return res


# Whether a larger figure is better, by the name's prefix.
def higher_is_better(key):
    short = key.split(" ", 1)[1]
    return not (short.startswith(("p50:", "p99:", "cpu:", "cpu-us/msg:", "idle", "open_s",
                                  "fallocate_s", "put_us:", "get_us:", "memcpy_us:",
                                  "timer_late_us:")))


def summarize(rounds):
    """Per key: each side's median and the ratios ours/vLLM of each round."""
    out = {}
    for key in rounds[0][0]:
        a = [r[0][key] for r in rounds if key in r[0]]
        b = [r[1][key] for r in rounds if key in r[1]]
        ratios = [y / x for x, y in zip(a, b) if x > 0]
        out[key] = {"vllm": statistics.median(a), "ours": statistics.median(b),
                    "ratio": statistics.median(ratios) if ratios else None,
                    "lo": min(ratios) if ratios else None,
                    "hi": max(ratios) if ratios else None,
                    "higher_is_better": higher_is_better(key)}
    return out


def fmt(v):
    if v is None:
        return "-"
    if abs(v) >= 100:
        return "%.0f" % v
    if abs(v) >= 1:
        return "%.2f" % v
    return "%.4f" % v


def print_report(summary, opts, nrounds, vllm_name):
    p = print
    p("vLLM side by side (%s): %d round(s), vLLM and ours alternating; ratio = ours/vLLM "
      "within a round," % (vllm_name, nrounds))
    p("median [lowest..highest]; '+' marks where a ratio above 1 is better for ours. Store: 1 writer "
      "+ 1 reader process in lock-step, %s ring; queue: %s x %d slots." %
      (human(opts.ring), human(QUEUE_CHUNK), QUEUE_CHUNKS))
    p("")
    p("%-44s | %12s %12s | %7s %17s" % ("measure", "vLLM", "ours", "ratio", "spread"))
    p("-" * 100)
    for key, s in summary.items():
        if key.split(" ", 1)[1].startswith("first:"):
            continue
        unit = ("pairs/s" if key.startswith("store ") and ":" not in key and "_s" not in key
                else "msgs/s" if key.startswith("queue ") and ":" not in key and "idle" not in key
                else "")
        label = key + (" " + unit if unit else "")
        spread = "[%s..%s]" % (fmt(s["lo"]), fmt(s["hi"])) if s["lo"] is not None else "-"
        p("%-44s | %12s %12s | %6s%s %17s" % (label[:44], fmt(s["vllm"]), fmt(s["ours"]),
                                            fmt(s["ratio"]), "+" if s["higher_is_better"] else " ",
                                            spread))
    p("")
    p("First lap (cold pages, before each process touched its mapping), per second:")
    for key, s in summary.items():
        if key.split(" ", 1)[1].startswith("first:"):
            p("  %-42s vLLM %10s  ours %10s  ratio %s" % (
                key.replace("first:", ""), fmt(s["vllm"]), fmt(s["ours"]), fmt(s["ratio"])))
    p("")
    p("p50/p99 in us (one-way, send to dequeued); cpu = reader CPU-seconds per second while paced;"
      " cpu-us/msg = CPU microseconds of the writer and every reader per message back to back"
      " (the readers' counted in clock ticks);"
      " idle cpu = in the first %g s after the last message; open_s = opening the store "
      "(fallocate_s: posix_fallocate of the ring's size alone, the reference for ours);"
      " put_us/get_us = microseconds spent inside put() in the writer and inside get() in the"
      " reader, per pair of the measured lock-step; memcpy_us = microseconds to copy 1 MiB into"
      " (in) or out of (out) memory that is mapped but not in the cache, in each side's process:"
      " what bounds a pair of 1 MiB objects; timer_late_us = the median microseconds a sleep of"
      " 150 us or 4.8 ms (timer slack 1 us) ends late, in each side's process: what a reader"
      " that sleeps between paced messages pays before it can poll." % opts.idle)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None, help="per measurement")
    ap.add_argument("--json", help="append each summary row to this file as a JSON line")
    ap.add_argument("--against-ours", action="store_true",
                    help="ours on both sides: checks this script without vLLM")
    ap.add_argument("--only", choices=("store", "queue"),
                    help="measure the store or the queue alone")
    ap.add_argument("--readers", default="1,4",
                    help="the queue's reader counts, comma-separated (default 1,4)")
    ap.add_argument("--queue-cells", choices=("all", "b2b", "paced"), default="all",
                    help="the queue's back-to-back rates, its paced latencies, or both")
    opts = ap.parse_args()
    quick = opts.quick or os.environ.get("BENCH_QUICK") == "1"
    opts.rounds = opts.rounds or (1 if quick else 3)
    opts.secs = opts.seconds or (0.2 if quick else 1.0)
    opts.idle = 0.3 if quick else 1.0
    opts.ring = (64 if quick else 1024) * MIB
    opts.max_object = 20 * MIB
    try:
        opts.readers = [int(n) for n in opts.readers.split(",")]
        if not opts.readers or not all(1 <= n <= 64 for n in opts.readers):
            raise ValueError
    except ValueError:
        ap.error("--readers %r: reader counts of 1 to 64, comma-separated" % opts.readers)
    opts.queue_sizes = QUEUE_SIZES if opts.queue_cells != "paced" else []
    opts.paced = PACED if opts.queue_cells != "b2b" else []
    multiprocessing.set_start_method("fork")

    if opts.against_ours:
        first, vllm_name = ours_side(), "ours against ours, a check of the harness"
    else:
        src = os.environ.get("VLLM_SRC", "")
        first = vllm_side(*load_vllm(src))
        vllm_name = "vLLM from %s" % (src or os.path.dirname(sys.modules["vllm"].__file__))
    ours = ours_side()

    import shmbroker
    opts.tmp = tempfile.mkdtemp(prefix="bench-vllm-")
    try:
        daemon = shmbroker.spawn_daemon("512M", args=["--max-object-size", "64M"])
    except (OSError, RuntimeError) as e:
        print("bench_vllm: cannot start shmbrokerd for the queues: %s (set SHMBROKERD to "
              "build/shmbrokerd, or run make bench-vllm)" % e, file=sys.stderr)
        return 2
    opts.queue_socket = daemon.socket_path
    rounds = []
    try:
        for r in range(opts.rounds):
            a = run_round(first, opts)
            b = run_round(ours, opts)
            rounds.append((a, b))
            print("round %d of %d done" % (r + 1, opts.rounds), file=sys.stderr)
    finally:
        daemon.stop()
    summary = summarize(rounds)
    print_report(summary, opts, len(rounds), vllm_name)
    if opts.json:
        with open(opts.json, "a") as f:
            for key, s in summary.items():
                f.write(json.dumps(dict(s, mode="vllm", key=key,
                                        against_ours=opts.against_ours)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
