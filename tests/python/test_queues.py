# SPDX-License-Identifier: Apache-2.0
"""Broadcast queues from Python (shmbroker.MessageQueue, vLLM's interface):
what vLLM's tests/distributed/test_shm_broadcast.py checks, written anew
against real daemons, and what it cannot check: a dead reader no longer
holding the writer back, the writer's death seen as the end of the queue,
shutdown waking a blocked reader, and an idle reader costing no CPU.

AreaTest runs the pure-Python data path over an area this file lays out
itself (proto/layout_queue.h), with no daemon, playing the daemon's part in
the area by hand.

Reader and writer processes are forked (multiprocessing's "fork" context);
each makes its own connection, and reports on a multiprocessing queue.
"""

import mmap
import multiprocessing
import os
import pickle
import random
import re
import resource
import signal
import struct
import sys
import threading
import time
import unittest
import unittest.mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE_DIR = os.path.join(ROOT, "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import shmbroker  # noqa: E402
from shmbroker import _futex, queue as Q  # noqa: E402
from shmbroker import MessageQueue  # noqa: E402

from support import DaemonTest, child_python  # noqa: E402

CTX = multiprocessing.get_context("fork")
# Generous bounds for things that should take milliseconds: a failure shows
# as an error, never as a hung test. No test asserts a duration.
WAIT = 30.0

KiB = 1024
MiB = 1024 * KiB


def numpy_or_skip(test):
    try:
        import numpy
    except ImportError:
        test.skipTest("numpy is not installed (make test installs python3-numpy)")
    return numpy


# ---- an area laid out by hand, the daemon's part played by the test --------

def format_area(seats, slots, slot_size, name="t"):
    """A memfd holding a fresh queue area as shmb_q_format lays it out:
    (fd, size)."""
    size = Q.queue_size(seats, slots, slot_size)
    fd = os.memfd_create("shmb-test-queue")
    os.ftruncate(fd, size)
    with mmap.mmap(fd, size) as mm:
        Q._GEOMETRY.pack_into(mm, 0, Q.QUEUE_MAGIC, Q.QUEUE_VERSION, seats, slots, slot_size,
                              (Q.SLOT_HEADER + slot_size + 63) // 64 * 64,
                              Q._slots_offset_for(seats), size)
        mm[Q.HEADER_OFFSETS["name"]:Q.HEADER_OFFSETS["name"] + len(name)] = name.encode()
    return fd, size


def attach(fd, size, seat=None, epoch=0):
    return Q._Area(mmap.mmap(fd, size), size, seat=seat, epoch=epoch)


def u32(area, offset, value=None):
    """Read (or write) a 32-bit word of the area, as the daemon does."""
    if value is None:
        return area._q32[offset // 4]
    area._q32[offset // 4] = value


def seat_take(area, seat):
    """shmb_q_seat_take: the seat starts at the next message; its epoch."""
    at = Q.HEADER_PAGE + seat * Q.SEAT_SIZE
    area._q64[at // 8] = area.published()
    epoch = area._q64[(at + 16) // 8] + 1
    area._q64[(at + 16) // 8] = epoch
    area._q32[(at + 8) // 4] = Q.SEAT_LIVE
    return epoch


def set_state(area, state):
    """shmb_q_shutdown / shmb_q_writer_gone: the state, the words bumped,
    the sleepers woken."""
    u32(area, Q.HEADER_OFFSETS["state"], state)
    _futex.fetch_add32(area._head_word_addr, 1)
    _futex.fetch_add32(area._free_word_addr, 1)
    _futex.futex_wake(area._head_word_addr, _futex.INT_MAX)
    _futex.futex_wake(area._free_word_addr, _futex.INT_MAX)


def message_bytes(i, slot_size):
    """Message i of the area tests: 0..slot_size bytes, known to both sides."""
    rng = random.Random(i)
    return rng.randbytes(rng.randrange(0, slot_size + 1))


def area_reader(fd, size, seat, epoch, count, slot_size, results):
    try:
        area = attach(fd, size, seat, epoch)
        bad = []
        for i in range(count):
            flags, payload, _aux = area.dequeue(WAIT)
            if flags != Q.SLOT_INLINE or bytes(payload) != message_bytes(i, slot_size):
                bad.append(i)
            payload.release()
            if i % 97 == 0:
                time.sleep(0.001)
        area.done()
        results.put((seat, "ok" if not bad else "messages %s differ" % bad[:10]))
    except BaseException as e:
        results.put((seat, "%s: %s" % (type(e).__name__, e)))


def area_blocked_reader(fd, size, seat, epoch, results):
    """Read messages with no timeout until a wait ends otherwise; report
    how many came and how the last wait ended."""
    area = attach(fd, size, seat, epoch)
    count = 0
    try:
        while True:
            area.dequeue(None)
            count += 1
    except BaseException as e:
        results.put((count, type(e).__name__))


@unittest.skipUnless(_futex.supported, _futex.why_unsupported or "")
class AreaTest(unittest.TestCase):
    """The Python data path over an area this test formats, no daemon."""

    def area(self, seats, slots, slot_size):
        fd, size = format_area(seats, slots, slot_size)
        self.addCleanup(os.close, fd)
        writer = attach(fd, size)
        self.addCleanup(writer.close)
        return fd, size, writer

    def join(self, procs):
        for p in procs:
            p.join(WAIT)
            if p.is_alive():
                p.kill()
                p.join()
                self.fail("a reader process did not end within %.0f s" % WAIT)

    # Where executable memory is refused, the atomics come from libatomic:
    # the same results as the machine code, and a queue works over them.
    def test_libatomic_atomics(self):
        lib = _futex._load_libatomic()
        if lib is None:
            self.skipTest("no libatomic.so.1 here (Debian: libatomic1)")
        import ctypes
        words = (ctypes.c_uint64 * 2)()
        at = ctypes.addressof(words)
        results = []
        for ops in ({n: getattr(_futex, n) for n in lib}, lib):
            words[0], words[1] = 5, 7
            results.append((ops["fetch_add32"](at, 3), words[0], ops["exchange32"](at, 9),
                            ops["cas64"](at + 8, 7, 11), words[1], ops["cas64"](at + 8, 7, 12),
                            words[1], ops["fetch_add32"](at, 0xFFFFFFFF), words[0]))
        self.assertEqual(results[0], results[1])
        self.assertEqual(results[1], (5, 8, 8, 7, 11, 11, 11, 9, 8))
        # As where no code page is allowed: bind() goes through them too.
        for name, fn in list(lib.items()) + [("code_pages", False)]:
            patch = unittest.mock.patch.object(_futex, name, fn)
            patch.start()
            self.addCleanup(patch.stop)
        fd, size, writer = self.area(1, 4, 64)
        reader = attach(fd, size, 0, seat_take(writer, 0))
        self.addCleanup(reader.close)
        for i in range(10):
            payload = writer.reserve(WAIT)[0]
            payload[0] = i
            payload.release()
            writer.publish(Q.SLOT_INLINE, 1)
            self.assertEqual(bytes(reader.dequeue(0)[1]), bytes([i]))
        reader.done()

    # bind(): the atomic operations of every message, on words fixed once
    # the area is mapped, in machine code of their own that takes their
    # addresses from the code (x86-64, where code pages are allowed), else
    # through the generic functions: either way what fetch_add32 and cas64
    # give, wrapping at 32 and 64 bits, and the area uses them.
    def test_bound_atomics(self):
        import ctypes
        words = (ctypes.c_uint64 * 2)()
        at = ctypes.addressof(words)
        results = []
        for code in (True, False):
            with unittest.mock.patch.object(_futex, "code_pages", code and _futex.code_pages):
                ops = _futex.bind(at, 3, at + 8)
            self.assertEqual(ops.machine_code,
                             code and _futex.code_pages and _futex.machine == "x86_64")
            words[0], words[1] = 5, 7
            got = [ops.add32(), words[0], ops.cas_next64(7), words[1], ops.cas_next64(7),
                   words[1], ops.cas_next64(8), words[1]]
            words[0], words[1] = (1 << 32) - 2, (1 << 64) - 1
            got += [ops.add32(), words[0], ops.cas_next64((1 << 64) - 1), words[1]]
            results.append(got)
            self.assertIsNone(_futex.bind(at, 1).cas_next64)
            self.assertIsNone(_futex.bind(cas_addr=at).add32)
        self.assertEqual(results[0], results[1])
        self.assertEqual(results[0], [5, 8, 7, 8, 8, 8, 8, 9, (1 << 32) - 2, 1,
                                      (1 << 64) - 1, 0])
        fd, size, writer = self.area(1, 4, 64)
        reader = attach(fd, size, 0, seat_take(writer, 0))
        self.addCleanup(reader.close)
        self.assertEqual(writer._ops.machine_code, _futex.code_pages
                         and _futex.machine == "x86_64")
        word = Q.HEADER_OFFSETS["head_word"] // 4
        for i in range(6):
            before = writer._q32[word]
            payload = writer.reserve(WAIT)[0]
            payload[0] = i
            payload.release()
            writer.publish(Q.SLOT_INLINE, 1)
            self.assertEqual(writer._q32[word], before + 1)
            self.assertEqual(bytes(reader.dequeue(0)[1]), bytes([i]))
            reader.done()
            self.assertEqual(reader.seat_next(0), i + 1)

    # A spin longer than the timeout does not stretch it.
    def test_spin_keeps_timeout(self):
        fd, size, writer = self.area(1, 2, 64)
        reader = attach(fd, size, 0, seat_take(writer, 0))
        self.addCleanup(reader.close)
        reader.spin_ns = 100 * 1000 * 1000
        start = time.monotonic()
        with self.assertRaises(shmbroker.Timeout):
            reader.dequeue(0.005)
        self.assertLess(time.monotonic() - start, 0.08)

    # A writer held back sleeps for its half-ring mark only a moment: when
    # the slowest reader frees one slot and then stops reading, the writer
    # has that slot at once, not at its timeout.
    def test_writer_not_held_by_mark(self):
        fd, size, writer = self.area(1, 8, 64)
        reader = attach(fd, size, 0, seat_take(writer, 0))
        self.addCleanup(reader.close)
        for i in range(8):
            writer.reserve(0)[0].release()
            writer.publish(Q.SLOT_INLINE, 1)
        done = []
        t = threading.Thread(target=lambda: done.append((writer.reserve(5)[0].release(),
                                                         time.monotonic())))
        t.start()
        while u32(writer, Q.HEADER_OFFSETS["writer_waiting"]) == 0:
            time.sleep(0.001)
        time.sleep(0.02)  # asleep for the mark by now
        freed = time.monotonic()
        reader.dequeue(0)[1].release()
        reader.done()  # one slot free; this reader then stops
        t.join(WAIT)
        self.assertEqual(len(done), 1)
        self.assertLess(done[0][1] - freed, 0.5)

    # The Python constants are proto/layout_queue.h's: every field offset of
    # its SHMB_LAYOUT_AT asserts, and the sizes.
    def test_layout_matches_header(self):
        with open(os.path.join(ROOT, "proto", "layout_queue.h"), encoding="utf-8") as f:
            text = f.read()
        tables = {"shmb_queue_header": Q.HEADER_OFFSETS, "shmb_queue_seat": Q.SEAT_OFFSETS,
                  "shmb_queue_slot": Q.SLOT_OFFSETS}
        found = re.findall(r"SHMB_LAYOUT_AT\(struct (\w+), (\w+), (\d+)\)", text)
        self.assertTrue(found)
        for struct_name, field, offset in found:
            self.assertEqual(tables[struct_name].get(field), int(offset),
                             "%s.%s" % (struct_name, field))
        for struct_name, table in tables.items():
            self.assertEqual(sorted(table), sorted(f for s, f, _ in found if s == struct_name))
        defines = dict(re.findall(r"#define (SHMB_QUEUE_\w+) (\w+)", text))
        self.assertEqual(int(defines["SHMB_QUEUE_SLOT_HEADER"].rstrip("u")), Q.SLOT_HEADER)
        self.assertEqual(int(defines["SHMB_QUEUE_SEAT_SIZE"].rstrip("u")), Q.SEAT_SIZE)
        self.assertEqual(int(defines["SHMB_QUEUE_SEATS_MAX"].rstrip("u")), Q.SEATS_MAX)
        self.assertEqual(int(defines["SHMB_QUEUE_INLINE"].rstrip("u")), Q.SLOT_INLINE)
        self.assertEqual(int(defines["SHMB_QUEUE_OBJECT"].rstrip("u")), Q.SLOT_OBJECT)
        self.assertIn("0x31455551424d4853", text.lower())
        self.assertEqual(Q.QUEUE_MAGIC, 0x31455551424D4853)
        self.assertEqual(Q.SLOT.size, 32)

    # 1 writer, 3 reader processes, 3000 messages of random sizes up to the
    # slot size through 4 slots: every reader gets every message, in order,
    # byte-identical.
    def test_broadcast_in_order(self):
        slot_size, count = 256, 3000
        fd, size, writer = self.area(3, 4, slot_size)
        epochs = [seat_take(writer, s) for s in range(3)]
        results = CTX.Queue()
        procs = [CTX.Process(target=area_reader,
                             args=(fd, size, s, epochs[s], count, slot_size, results))
                 for s in range(3)]
        for p in procs:
            p.start()
        for i in range(count):
            data = message_bytes(i, slot_size)
            payload, _, _ = writer.reserve(WAIT)
            payload[:len(data)] = data
            payload.release()
            writer.publish(Q.SLOT_INLINE, len(data))
        got = sorted(results.get(timeout=WAIT) for _ in procs)
        self.join(procs)
        self.assertEqual(got, [(s, "ok") for s in range(3)])
        self.assertEqual(writer.published(), count)

    # A reader's wait with a timeout and nothing published raises Timeout, a
    # TimeoutError; with timeout 0 it does not wait at all.
    def test_dequeue_timeout(self):
        fd, size, writer = self.area(1, 2, 64)
        reader = attach(fd, size, 0, seat_take(writer, 0))
        self.addCleanup(reader.close)
        for timeout in (0.05, 0):
            with self.assertRaises(TimeoutError) as cm:
                reader.dequeue(timeout)
            self.assertIsInstance(cm.exception, shmbroker.Timeout)
        # The wait announced itself and took the announcement back.
        self.assertEqual(u32(writer, Q.HEADER_OFFSETS["readers_waiting"]), 0)

    # A writer whose slots are all unread waits, and times out naming the
    # seat that holds it back.
    def test_writer_waits_for_slowest_seat(self):
        fd, size, writer = self.area(2, 2, 64)
        seat_take(writer, 0)
        reader = attach(fd, size, 1, seat_take(writer, 1))
        self.addCleanup(reader.close)
        for _ in range(2):
            writer.reserve(0)[0].release()
            writer.publish(Q.SLOT_INLINE, 0)
        reader.dequeue(0)
        reader.done()
        with self.assertRaisesRegex(shmbroker.Timeout, "seat 0 has not read message 0"):
            writer.reserve(0.02)

    # Shutdown (the daemon's stores and wakes) ends a reader's futex sleep
    # with Cancelled, and every later wait of either side.
    def test_shutdown_wakes_sleeping_reader(self):
        fd, size, writer = self.area(1, 4, 64)
        epoch = seat_take(writer, 0)
        results = CTX.Queue()
        p = CTX.Process(target=area_blocked_reader, args=(fd, size, 0, epoch, results))
        p.start()
        for published in (1, 2):
            deadline = time.monotonic() + WAIT
            while u32(writer, Q.HEADER_OFFSETS["readers_waiting"]) == 0:
                self.assertLess(time.monotonic(), deadline, "the reader never slept")
                time.sleep(0.001)
            if published == 1:
                writer.reserve(0)[0].release()
                writer.publish(Q.SLOT_INLINE, 0)  # wakes it: it reads, and sleeps again
                time.sleep(0.01)
        set_state(writer, Q.QUEUE_SHUTDOWN)
        self.assertEqual(results.get(timeout=WAIT), (1, "Cancelled"))
        self.join([p])
        with self.assertRaises(shmbroker.Cancelled):
            writer.reserve(WAIT)

    # The writer gone: a reader drains what was published, then EndOfQueue.
    def test_writer_gone_drains(self):
        fd, size, writer = self.area(1, 4, 64)
        reader = attach(fd, size, 0, seat_take(writer, 0))
        self.addCleanup(reader.close)
        for i in range(3):
            payload = writer.reserve(0)[0]
            payload[0] = i
            payload.release()
            writer.publish(Q.SLOT_INLINE, 1)
        set_state(writer, Q.QUEUE_WRITER_GONE)
        for i in range(3):
            self.assertEqual(bytes(reader.dequeue(0)[1]), bytes([i]))
        with self.assertRaises(shmbroker.EndOfQueue):
            reader.dequeue(WAIT)
        with self.assertRaises(shmbroker.ConnectionLost):
            writer.reserve(WAIT)

    # A writer whose role went to another (the daemon bumped the writer
    # epoch) can neither publish what it reserved nor reserve again.
    def test_replaced_writer_cannot_publish(self):
        fd, size, writer = self.area(1, 4, 64)
        reader = attach(fd, size, 0, seat_take(writer, 0))
        self.addCleanup(reader.close)
        payload = writer.reserve(0)[0]
        payload[0] = 7
        payload.release()
        writer.publish(Q.SLOT_INLINE, 1)
        writer.reserve(0)[0].release()
        writer._q64[Q.HEADER_OFFSETS["writer_epoch"] // 8] = 1  # the daemon's next writer
        with self.assertRaisesRegex(shmbroker.ConnectionLost, "no longer the queue's writer"):
            writer.publish(Q.SLOT_INLINE, 1)
        with self.assertRaises(shmbroker.ConnectionLost):
            writer.reserve(0)
        self.assertEqual(bytes(reader.dequeue(0)[1]), b"\x07")
        with self.assertRaises(shmbroker.Timeout):
            reader.dequeue(0)

    # The one-frame fast path of a message writes and reads exactly what the
    # frames layout does (frames.write, frames.parse), and leaves every other
    # message to it.
    def test_message_fast_path_is_frames_layout(self):
        from shmbroker import frames
        cases = [[b""], [b"x"], [bytes(range(63))], [b"y" * 64], [b"z" * 1000],
                 [b"a", b"bc"], [b"", b"", b"d" * 100]]
        for bufs in cases:
            bufs = [memoryview(b) for b in bufs]
            size = frames.layout([b.nbytes for b in bufs])[2]
            self.assertEqual(Q._message_size(bufs), size)
            fast, slow = bytearray(b"\xee" * size), bytearray(b"\xee" * size)
            Q._write_message(memoryview(fast), bufs)
            frames.write(memoryview(slow), bufs)
            self.assertEqual(fast, slow)
            self.assertEqual([bytes(v) for v in Q._read_message(memoryview(fast))],
                             [bytes(v) for v in frames.parse(memoryview(slow))])
        with self.assertRaises(shmbroker.ProtocolError):
            Q._read_message(memoryview(bytes(80)))

    # An area whose header does not hold a queue is refused.
    def test_attach_checks_header(self):
        fd, size, writer = self.area(1, 2, 64)
        writer._q32[Q.HEADER_OFFSETS["slot_size"] // 4] = 128
        with self.assertRaisesRegex(shmbroker.ShmBrokerError, "corrupt"):
            attach(fd, size)
        writer._q64[0] = 0
        with self.assertRaisesRegex(shmbroker.ShmBrokerError, "not a queue"):
            attach(fd, size)


# ---- through the daemon --------------------------------------------------------

def test_objects(count, slot_size):
    """The messages of the broadcast test: small and large Python objects,
    bytearrays (pickled out-of-band), some larger than a slot."""
    out = []
    for i in range(count):
        rng = random.Random(i)
        kind = i % 4
        if kind == 0:
            out.append(i)
        elif kind == 1:
            out.append({"i": i, "text": "x" * rng.randrange(0, 2 * slot_size)})
        elif kind == 2:
            out.append(bytearray(rng.randbytes(rng.randrange(0, 3 * slot_size))))
        else:
            out.append(("tuple", i, [None, True, 1.5], rng.randbytes(rng.randrange(0, 64))))
    return out


def run_child(results, tag, fn, *args):
    """fn(*args) in a child; its result or its exception on results."""
    try:
        results.put((tag, fn(*args)))
    except BaseException as e:
        results.put((tag, "%s: %s" % (type(e).__name__, e)))


def broadcast_reader(handle, rank, count, slot_size):
    with MessageQueue.create_from_handle(handle, rank) as mq:
        mq.wait_until_ready(WAIT)
        want = test_objects(count, slot_size)
        for i in range(count):
            got = mq.broadcast_object()
            if got != want[i]:
                return "message %d: got %.60r, want %.60r" % (i, got, want[i])
    return "ok"


def numpy_arrays(n, seed):
    """vLLM's get_arrays: n int64 arrays of 1..10000 elements (40 KB on
    average), from a seed both sides know."""
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 10000, n)
    return [rng.integers(1, 100, int(k)) for k in sizes]


def numpy_reader(handle, rank, n, seed):
    import numpy as np

    rng = random.Random(rank)
    with MessageQueue.create_from_handle(handle, rank) as mq:
        mq.wait_until_ready(WAIT)
        for i, want in enumerate(numpy_arrays(n, seed)):
            got = mq.dequeue(WAIT)
            if not (isinstance(got, np.ndarray) and got.dtype == want.dtype
                    and np.array_equal(got, want)):
                return "array %d differs: %.80r" % (i, got)
            if rng.random() < 0.05:
                time.sleep(rng.random() / 1000)
    return "ok"


def blocked_reader(handle, rank, ready):
    """Block in dequeue() with no timeout; how the wait ended, and how long
    after the shutdown was sent it ended (ready: an Event set just before)."""
    with MessageQueue.create_from_handle(handle, rank) as mq:
        mq.wait_until_ready(WAIT)
        ready.set()
        try:
            mq.dequeue()
            return ("returned", 0.0)
        except shmbroker.Cancelled as e:
            return ("Cancelled", isinstance(e, RuntimeError) and "cancelled" in str(e))


def idle_reader(handle, rank, seconds):
    """The CPU time (user + system, s) of a reader waiting seconds for a
    message that does not come."""
    with MessageQueue.create_from_handle(handle, rank) as mq:
        mq.wait_until_ready(WAIT)
        before = resource.getrusage(resource.RUSAGE_SELF)
        try:
            mq.dequeue(timeout=seconds)
            return "a message came"
        except shmbroker.Timeout:
            pass
        after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def stalled_reader(handle, rank, reads, ready):
    """Read `reads` messages, say so, then hold the seat without reading
    until killed."""
    with MessageQueue.create_from_handle(handle, rank) as mq:
        mq.wait_until_ready(WAIT)
        for _ in range(reads):
            mq.dequeue(WAIT)
        ready.set()
        time.sleep(3600)


def counting_reader(handle, rank, count):
    """Read count messages; they must be 0..count-1 in order."""
    with MessageQueue.create_from_handle(handle, rank) as mq:
        mq.wait_until_ready(WAIT)
        for i in range(count):
            got = mq.dequeue(WAIT)
            if got != i:
                return "message %d is %r" % (i, got)
    return "ok"


def doomed_writer(socket_path, pipe, count):
    """A writer that sends its handle, publishes count messages (no more
    than its 4 slots) once the reader is in, says so, and waits to be
    killed."""
    mq = MessageQueue(1, socket_path=socket_path, max_chunk_bytes=1024, max_chunks=4)
    pipe.send(mq.export_handle())
    mq.wait_until_ready(WAIT)
    for i in range(count):
        mq.enqueue(("last words", i, bytes(2000 * (i % 2))), timeout=WAIT)
    pipe.send("published")
    time.sleep(3600)


class QueueTest(DaemonTest):
    """MessageQueue between processes through a real daemon."""

    DAEMON_SIZE = "64M"

    def setUp(self):
        if not _futex.supported:
            self.skipTest(_futex.why_unsupported)
        super().setUp()
        reply = self.c.request({"op": "queue_list"})
        if reply.get("error") == "ENOSYS":
            self.skipTest("this shmbrokerd has no queue ops")
        self.procs = []
        self.addCleanup(self.reap)

    def reap(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join()

    def writer(self, n_reader, **kw):
        mq = MessageQueue(n_reader, socket_path=self.d.socket_path, **kw)
        self.addCleanup(mq.close)
        return mq

    def start(self, results, tag, fn, *args):
        p = CTX.Process(target=run_child, args=(results, tag, fn) + args)
        p.start()
        self.procs.append(p)
        return p

    def outcomes(self, results, n):
        return dict(results.get(timeout=WAIT * 4) for _ in range(n))

    def queue(self, name):
        for q in self.c.queue_list(seats=True):
            if q["name"] == name:
                return q
        return None

    # vLLM's test_shm_broadcast: one writer, several readers, each reader
    # gets every object broadcast, in order; here with objects smaller and
    # larger than a slot, out-of-band buffers, and a ring that wraps.
    def test_broadcast_in_order(self):
        count, slot = 400, 1024
        mq = self.writer(3, max_chunk_bytes=slot, max_chunks=4)
        handle = pickle.loads(pickle.dumps(mq.export_handle()))
        results = CTX.Queue()
        for rank in range(3):
            self.start(results, rank, broadcast_reader, handle, rank, count, slot)
        mq.wait_until_ready(WAIT)
        for obj in test_objects(count, slot):
            self.assertIs(mq.broadcast_object(obj), obj)
        self.assertEqual(self.outcomes(results, 3), {0: "ok", 1: "ok", 2: "ok"})
        q = self.queue(mq.name)
        self.assertEqual(q["messages"], count)
        self.assertEqual(q["seats"], 3)

    # The test: 10,000 pickled numpy arrays (vLLM's sizes, about
    # half of them larger than the 40 KiB slots) from one writer to four
    # reader processes, with random short sleeps on both sides: every reader
    # gets every array, in order, equal.
    def test_numpy_arrays_to_four_readers(self):
        numpy_or_skip(self)
        n, seed = 10000, 1234
        mq = self.writer(4, max_chunk_bytes=40 * KiB, max_chunks=2)
        handle = mq.export_handle()
        results = CTX.Queue()
        for rank in range(4):
            self.start(results, rank, numpy_reader, handle, rank, n, seed)
        mq.wait_until_ready(WAIT)
        rng = random.Random(0)
        arrays = numpy_arrays(n, seed)
        self.assertTrue(any(a.nbytes > 40 * KiB for a in arrays))
        start = time.monotonic()
        for a in arrays:
            mq.enqueue(a, timeout=WAIT)
            if rng.random() < 0.05:
                time.sleep(rng.random() / 1000)
        self.assertEqual(self.outcomes(results, 4), {r: "ok" for r in range(4)})
        sys.stdout.write("  10,000 numpy arrays to 4 readers in %.1f s\n"
                         % (time.monotonic() - start))

    # set_spin(us): a reader waiting for a message that comes within its spin
    # never sleeps on the futex (no wake-up to pay); out-of-range values are
    # refused. The adaptive default (at most 50 us) would be asleep.
    def test_set_spin(self):
        mq = self.writer(1)
        with MessageQueue.create_from_handle(mq.export_handle(), 0) as reader:
            reader.wait_until_ready(WAIT)
            for bad in (-1, 100001, 1.5, "10"):
                with self.assertRaises(shmbroker.InvalidRequest):
                    reader.set_spin(bad)
            reader.set_spin(100000)
            got = []
            t = threading.Thread(target=lambda: got.append(reader.dequeue(timeout=WAIT)))
            start = time.monotonic()
            t.start()
            while time.monotonic() - start < 0.03:
                waiting = u32(reader._area, Q.HEADER_OFFSETS["readers_waiting"])
                if waiting and time.monotonic() - start < 0.09:
                    self.fail("the reader slept in a wait that should spin 100 ms")
                time.sleep(0.001)
            mq.enqueue("spun")
            t.join(WAIT)
            self.assertEqual(got, ["spun"])

    # dequeue(timeout) with nothing sent raises Timeout, a TimeoutError (as
    # vLLM's TimeoutError); timeout 0 does not wait.
    def test_dequeue_timeout(self):
        mq = self.writer(1)
        with MessageQueue.create_from_handle(mq.export_handle(), 0) as reader:
            reader.wait_until_ready(WAIT)
            for timeout in (0.05, 0):
                with self.assertRaises(TimeoutError) as cm:
                    reader.dequeue(timeout=timeout)
                self.assertIsInstance(cm.exception, shmbroker.Timeout)
            mq.enqueue("after")
            self.assertEqual(reader.dequeue(timeout=WAIT), "after")

    # shutdown_queue() wakes a reader (of another process) blocked in
    # dequeue() with no timeout: it raises Cancelled, a RuntimeError saying
    # "cancelled"; the writer's next enqueue raises it too.
    def test_shutdown_queue_wakes_blocked_reader(self):
        mq = self.writer(1)
        results = CTX.Queue()
        ready = CTX.Event()
        self.start(results, "reader", blocked_reader, mq.export_handle(), 0, ready)
        mq.wait_until_ready(WAIT)
        self.assertTrue(ready.wait(WAIT))
        deadline = time.monotonic() + WAIT
        while self.queue(mq.name)["readers_waiting"] == 0:
            self.assertLess(time.monotonic(), deadline, "the reader never went to sleep")
            time.sleep(0.005)
        sent = time.monotonic()
        mq.shutdown_queue()
        self.assertEqual(self.outcomes(results, 1), {"reader": ("Cancelled", True)})
        sys.stdout.write("  blocked reader woke by shutdown within %.1f ms\n"
                         % ((time.monotonic() - sent) * 1000))
        with self.assertRaises(shmbroker.Cancelled):
            mq.enqueue("too late", timeout=WAIT)
        self.assertEqual(self.queue(mq.name)["state"], "shutdown")

    # vLLM's test_message_queue_shutdown: a reader times out, then another
    # thread of its process calls shutdown() while it waits: the wait ends
    # with Cancelled.
    def test_shutdown_from_another_thread(self):
        mq = self.writer(1)
        with MessageQueue.create_from_handle(mq.export_handle(), 0) as reader:
            reader.wait_until_ready(WAIT)
            with self.assertRaises(TimeoutError):
                reader.dequeue(timeout=0.001)
            t = threading.Timer(0.05, reader.shutdown)
            t.start()
            try:
                with self.assertRaisesRegex(RuntimeError, "cancelled"):
                    reader.dequeue(timeout=WAIT)
            finally:
                t.join()
            self.assertTrue(reader.shutting_down)

    # The daemon stopping (SIGTERM) shuts its queues down: a reader waiting
    # in dequeue() gets Cancelled.
    def test_daemon_stop_cancels_waits(self):
        mq = self.writer(1)
        with MessageQueue.create_from_handle(mq.export_handle(), 0) as reader:
            reader.wait_until_ready(WAIT)
            t = threading.Timer(0.05, self.d.stop)
            t.start()
            try:
                with self.assertRaises(shmbroker.Cancelled):
                    reader.dequeue(timeout=WAIT)
            finally:
                t.join()
            with self.assertRaises(shmbroker.Cancelled):
                mq.enqueue("after the stop", timeout=WAIT)

    # A reader SIGKILLed while the writer waits for it: the writer goes on
    # (its waits no longer count the dead seat) and queue_list shows the
    # seat dead; before the kill, the stalled reader is the queue's blocker.
    def test_killed_reader_releases_writer(self):
        mq = self.writer(2, max_chunk_bytes=256, max_chunks=4)
        handle = mq.export_handle()
        results = CTX.Queue()
        ready = CTX.Event()
        stalled = CTX.Process(target=stalled_reader, args=(handle, 0, 2, ready))
        stalled.start()
        self.procs.append(stalled)
        self.start(results, "reader1", counting_reader, handle, 1, 50)
        mq.wait_until_ready(WAIT)
        for sent in range(2):
            mq.enqueue(sent, timeout=WAIT)
        self.assertTrue(ready.wait(WAIT))
        sent, held = 2, 0
        while held < 3:  # seat 1 may lag a moment; seat 0 never reads again
            try:
                mq.enqueue(sent, timeout=0.1)
                sent += 1
            except shmbroker.Timeout as e:
                held = held + 1 if "seat 0" in str(e) else 0
            self.assertLess(sent, 50, "the writer was never held back")
        q = self.queue(mq.name)
        self.assertEqual(q["blocker"]["seat"], 0)
        self.assertEqual(q["blocker"]["pid"], stalled.pid)
        os.kill(stalled.pid, signal.SIGKILL)
        stalled.join(WAIT)
        killed = time.monotonic()
        mq.enqueue(sent, timeout=WAIT)
        sys.stdout.write("  writer went on %.1f ms after the SIGKILL was reaped\n"
                         % ((time.monotonic() - killed) * 1000))
        for i in range(sent + 1, 50):
            mq.enqueue(i, timeout=WAIT)
        self.assertEqual(self.outcomes(results, 1), {"reader1": "ok"})
        q = self.queue(mq.name)
        states = {s["seat"]: s["state"] for s in q["seat_list"]}
        self.assertEqual(states[0], "dead")
        self.assertEqual(q["seats_dead"], 1)

    # The writer SIGKILLed: its reader reads everything it published (inline
    # and overflow), then gets EndOfQueue, an EOFError.
    def test_killed_writer_is_end_of_queue(self):
        parent, child = CTX.Pipe()
        p = CTX.Process(target=doomed_writer, args=(self.d.socket_path, child, 4))
        p.start()
        self.procs.append(p)
        self.assertTrue(parent.poll(WAIT))
        with MessageQueue.create_from_handle(parent.recv(), 0) as reader:
            reader.wait_until_ready(WAIT)
            self.assertTrue(parent.poll(WAIT))
            self.assertEqual(parent.recv(), "published")
            os.kill(p.pid, signal.SIGKILL)
            p.join(WAIT)
            for i in range(4):
                self.assertEqual(reader.dequeue(timeout=WAIT),
                                 ("last words", i, bytes(2000 * (i % 2))))
            with self.assertRaises(EOFError) as cm:
                reader.dequeue(timeout=WAIT)
            self.assertIsInstance(cm.exception, shmbroker.EndOfQueue)
            self.assertEqual(self.queue(reader.name)["state"], "writer_gone")

    # A reader waiting for a message uses no CPU: under 10 ms of CPU time
    # over 1 s of waiting (a spinning reader uses about 1 s).
    def test_idle_reader_uses_no_cpu(self):
        mq = self.writer(1)
        results = CTX.Queue()
        self.start(results, "cpu", idle_reader, mq.export_handle(), 0, 1.0)
        mq.wait_until_ready(WAIT)
        cpu = self.outcomes(results, 1)["cpu"]
        self.assertIsInstance(cpu, float, cpu)
        sys.stdout.write("  idle reader: %.2f ms of CPU over 1 s\n" % (cpu * 1000))
        self.assertLess(cpu, 0.010)

    # Leaving: a reader's close frees its seat; the writer's close ends the
    # queue for its readers; a temporary queue goes once both have left.
    def test_close(self):
        mq = MessageQueue(2, socket_path=self.d.socket_path)
        handle = mq.export_handle()
        r0 = MessageQueue.create_from_handle(handle, 0)
        r1 = MessageQueue.create_from_handle(handle, 1)
        r1.close()
        q = self.queue(mq.name)
        self.assertEqual([s["state"] for s in q["seat_list"]], ["live", "free"])
        mq.enqueue("bye")
        mq.close()
        self.assertEqual(r0.dequeue(timeout=WAIT), "bye")
        with self.assertRaises(shmbroker.EndOfQueue):
            r0.dequeue(timeout=WAIT)
        r0.close()
        with self.assertRaises(shmbroker.ConnectionLost):
            r0.dequeue()
        deadline = time.monotonic() + WAIT
        while self.queue(mq.name) is not None:
            self.assertLess(time.monotonic(), deadline, "the temporary queue stayed")
            time.sleep(0.01)

    # Issue 24: Client.queue_list() and stats() give each queue's summary,
    # which does not grow with its seats; seats=True brings them, named.
    def test_queue_list_summary_and_seats(self):
        mq = MessageQueue(2, socket_path=self.d.socket_path)
        self.addCleanup(mq.close)
        handle = mq.export_handle()
        r0 = MessageQueue.create_from_handle(handle, 0)
        self.addCleanup(r0.close)
        for q in ([q for q in self.c.queue_list() if q["name"] == mq.name] +
                  [q for q in self.c.stats()["queues"] if q["name"] == mq.name]):
            self.assertNotIn("seat_list", q)
            self.assertEqual((q["seats_live"], q["seats_free"]), (1, 1))
        for q in ([q for q in self.c.queue_list(seats=True) if q["name"] == mq.name] +
                  [q for q in self.c.stats(seats=True)["queues"] if q["name"] == mq.name]):
            self.assertEqual([s["state"] for s in q["seat_list"]], ["live", "free"])

    # A rank that is not a local reader is refused (readers on other hosts
    # are not supported), and so is a wrong role's call.
    def test_roles(self):
        mq = self.writer(2, local_reader_ranks=[3, 5])
        with self.assertRaises(shmbroker.Unsupported):
            MessageQueue.create_from_handle(mq.export_handle(), 4)
        with MessageQueue.create_from_handle(mq.export_handle(), 5) as reader:
            self.assertEqual(reader.local_reader_rank, 1)
            with self.assertRaises(ValueError):
                reader.enqueue(1)
            with self.assertRaises(ValueError):
                mq.dequeue()

    def reader(self, mq, rank=0, **kw):
        r = MessageQueue.create_from_handle(mq.export_handle(), rank, **kw)
        self.addCleanup(r.close)
        return r

    def pins(self, prefix):
        return {o["key"]: o["pins"] for o in
                self.c.request({"op": "list", "prefix": prefix})["objects"]}

    # A message larger than a slot that cannot be asked for because the
    # reader's client is busy in another thread (EBUSY, nothing sent) stays
    # at the seat: the next dequeue returns it, not the message after it.
    def test_busy_client_keeps_overflow_message(self):
        mq = self.writer(1, max_chunk_bytes=256, max_chunks=4)
        shared = self.d.client(name="shared")
        self.addCleanup(shared.close)
        reader = self.reader(mq, client=shared)
        mq.enqueue(("big", 0, b"x" * 1000))
        mq.enqueue(("big", 1, b"y" * 1000))
        self.assertTrue(shared._busy.acquire(False))  # another thread's call
        try:
            with self.assertRaises(shmbroker.ShmBrokerError) as cm:
                reader.dequeue(timeout=WAIT)
            self.assertEqual(cm.exception.code, "EBUSY")
        finally:
            shared._busy.release()
        self.assertEqual(reader.dequeue(timeout=WAIT), ("big", 0, b"x" * 1000))
        self.assertEqual(reader.dequeue(timeout=WAIT), ("big", 1, b"y" * 1000))

    # The release of an overflow message's pin that finds the client busy
    # is kept and sent with the client's next request: the message is
    # returned, and no pin stays behind.
    def test_busy_client_release_is_sent_later(self):
        mq = self.writer(1, max_chunk_bytes=256, max_chunks=4)
        shared = self.d.client(name="shared")
        self.addCleanup(shared.close)
        reader = self.reader(mq, client=shared)
        real = shared.release
        refused = []

        def busy_once(key, **kw):
            if not refused:
                refused.append(key)
                raise shmbroker.ShmBrokerError("EBUSY", "busy (test)")
            return real(key, **kw)
        shared.release = busy_once
        mq.enqueue(b"z" * 1000)
        self.assertEqual(reader.dequeue(timeout=WAIT), b"z" * 1000)
        self.assertEqual(len(refused), 1)
        shared.stats()  # the next request carries the kept release
        self.assertEqual(self.pins("q/%s/" % mq.name), {refused[0]: 0})

    # An overflow slot's aux is the message's length, which may be less
    # than its object's size (a writer that reserved more than it sent, as
    # the C library's may): the reader takes the first aux bytes. An aux
    # larger than the object is refused as corrupt.
    def test_overflow_object_larger_than_message(self):
        from shmbroker.pickling import pickle_frames
        mq = self.writer(1, max_chunk_bytes=256, max_chunks=4)
        reader = self.reader(mq)
        area = mq._area

        def publish_object(obj, extra, aux_extra=0):
            bufs = pickle_frames(obj)
            total = Q._message_size(bufs)
            buf = bytearray(total + extra)
            Q._write_message(memoryview(buf)[:total], bufs)
            payload = area.reserve(WAIT)[0]
            try:
                key = mq._object_key(area.head)
                self.c.put(key, buf, readers=1)
                payload[:len(key)] = key.encode()
                area.publish(Q.SLOT_OBJECT, len(key), total + aux_extra)
            finally:
                payload.release()
                area._reserved = False
        publish_object(("longer object", b"q" * 300), 411)
        self.assertEqual(reader.dequeue(timeout=WAIT), ("longer object", b"q" * 300))
        publish_object(("short object", b"s" * 300), 0, aux_extra=1)
        with self.assertRaisesRegex(shmbroker.ShmBrokerError, "corrupt") as cm:
            reader.dequeue(timeout=WAIT)
        self.assertEqual(cm.exception.code, "EIO")

    # close() from another thread while a reader waits in dequeue(): the
    # wait ends with ConnectionLost and the area is unmapped only after it
    # left; a later wake-up of the futex word touches nothing unmapped (the
    # process does not crash). queue_close is left out (_role None): the
    # daemon's wake-up of the dropped seat would race with the unmap.
    def test_close_from_another_thread_while_waiting(self):
        code = r"""
import sys, threading, time
from shmbroker import MessageQueue
w = MessageQueue(1, max_chunk_bytes=256, max_chunks=4, socket_path=sys.argv[1])
r = MessageQueue.create_from_handle(w.export_handle(), 0)
out = []
def wait():
    try:
        out.append(repr(r.dequeue(timeout=30)))
    except BaseException as e:
        out.append(type(e).__name__)
t = threading.Thread(target=wait)
t.start()
time.sleep(0.2)
r._role = None
r.close()
t.join(30)
w.enqueue("wake")
time.sleep(0.1)
print(out, t.is_alive())
"""
        p = child_python(code, self.d.socket_path)
        out, err = p.communicate(timeout=WAIT * 2)
        self.assertEqual(p.returncode, 0, err.decode(errors="replace"))
        self.assertEqual(out.decode().strip(), "['ConnectionLost'] False")

    # The daemon killed (SIGKILL: no shutdown, nobody wakes anyone): a
    # reader and a writer waiting with no timeout raise ConnectionLost
    # saying the daemon went away, instead of sleeping for ever.
    def test_daemon_killed_ends_waits(self):
        mq = self.writer(1, max_chunk_bytes=256, max_chunks=2)
        other = self.writer(1, max_chunk_bytes=256, max_chunks=2)
        reader = self.reader(mq)
        self.reader(other)
        other.enqueue(0)
        other.enqueue(1)  # the ring is full: the next enqueue waits
        got = {}

        def call(tag, fn):
            try:
                got[tag] = fn()
            except BaseException as e:
                got[tag] = e
        threads = [threading.Thread(target=call, args=("r", reader.dequeue), daemon=True),
                   threading.Thread(target=call, args=("w", lambda: other.enqueue(2)),
                                    daemon=True)]
        for t in threads:
            t.start()
        time.sleep(0.1)
        self.d.kill()
        for t in threads:
            t.join(WAIT)
            self.assertFalse(t.is_alive(), "a wait outlived its daemon")
        for tag in "rw":
            self.assertIsInstance(got[tag], shmbroker.ConnectionLost, tag)
            self.assertIn("shmbrokerd went away", str(got[tag]))
        # A short wait sees it too (a loop of them would never otherwise).
        with self.assertRaisesRegex(shmbroker.ConnectionLost, "shmbrokerd went away"):
            reader.dequeue(timeout=0.3)

    # A MessageQueue used in a child made by fork() raises ECHILD and
    # touches nothing: the parent's writer and reader go on in step, and
    # the queue is not shut down. shutdown() (vLLM's, which never raises)
    # only marks the child's copy.
    def test_fork_child_cannot_use_queue(self):
        mq = self.writer(1, max_chunk_bytes=256, max_chunks=8)
        reader = self.reader(mq)
        mq.enqueue("a")
        self.assertEqual(reader.dequeue(timeout=WAIT), "a")
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            codes = []
            for fn in (lambda: mq.enqueue("from the child"), lambda: reader.dequeue(0),
                       lambda: mq.wait_until_ready(0), mq.shutdown_queue, reader.close,
                       reader.shutdown):
                try:
                    fn()
                    codes.append("ok")
                except shmbroker.ShmBrokerError as e:
                    codes.append(e.code)
                except BaseException as e:
                    codes.append(type(e).__name__)
            os.write(wfd, " ".join(codes).encode())
            os._exit(0)
        os.close(wfd)
        try:
            os.waitpid(pid, 0)
            codes = os.read(rfd, 1000).decode()
        finally:
            os.close(rfd)
        self.assertEqual(codes, " ".join(["ECHILD"] * 5 + ["ok"]))
        self.assertFalse(reader.shutting_down)
        mq.enqueue("b")
        self.assertEqual(reader.dequeue(timeout=WAIT), "b")
        self.assertEqual(self.queue(mq.name)["state"], "open")

    # An object left at the next message's key by a writer that died
    # between committing it and publishing its slot is deleted, and the
    # message goes (it used to fail with KeyExists for ever).
    def test_leftover_overflow_object_is_replaced(self):
        mq = self.writer(1, max_chunk_bytes=256, max_chunks=4)
        reader = self.reader(mq)
        self.c.put("q/%s/0" % mq.name, b"stale" * 100)
        mq.enqueue(b"B" * 1000, timeout=WAIT)
        self.assertEqual(reader.dequeue(timeout=WAIT), b"B" * 1000)

    # shutdown_queue() after close() raises ConnectionLost (not
    # AttributeError); shutdown(), vLLM's, never raises and only says so.
    def test_shutdown_after_close(self):
        mq = self.writer(1)
        mq.close()
        with self.assertRaises(shmbroker.ConnectionLost):
            mq.shutdown_queue()
        mq.shutdown()
        self.assertTrue(mq.shutting_down)
