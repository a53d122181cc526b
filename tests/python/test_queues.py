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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE_DIR = os.path.join(ROOT, "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import shmbroker  # noqa: E402
from shmbroker import _futex, queue as Q  # noqa: E402
from shmbroker import MessageQueue  # noqa: E402

from support import DaemonTest  # noqa: E402

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
    """Wait for a message that never comes; report how the wait ended."""
    area = attach(fd, size, seat, epoch)
    try:
        area.dequeue(None)
        results.put("returned")
    except BaseException as e:
        results.put(type(e).__name__)


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
    # with Cancelled; the end of the writer drains, then EndOfQueue.
    def test_shutdown_and_writer_gone(self):
        fd, size, writer = self.area(2, 4, 64)
        epochs = [seat_take(writer, s) for s in range(2)]
        results = CTX.Queue()
        p = CTX.Process(target=area_blocked_reader, args=(fd, size, 0, epochs[0], results))
        p.start()
        deadline = time.monotonic() + WAIT
        while u32(writer, Q.HEADER_OFFSETS["readers_waiting"]) == 0:
            self.assertLess(time.monotonic(), deadline, "the reader never slept")
            time.sleep(0.001)
        writer.reserve(0)[0].release()
        writer.publish(Q.SLOT_INLINE, 0)  # wakes it: it reads and sleeps again
        reader = attach(fd, size, 1, epochs[1])
        self.addCleanup(reader.close)
        reader.dequeue(0)
        reader.done()
        set_state(writer, Q.QUEUE_WRITER_GONE)
        with self.assertRaises(shmbroker.EndOfQueue):
            reader.dequeue(WAIT)
        set_state(writer, Q.QUEUE_SHUTDOWN)
        self.assertEqual(results.get(timeout=WAIT), "Cancelled")
        self.join([p])
        with self.assertRaises(shmbroker.Cancelled):
            writer.reserve(WAIT)

    # An area whose header does not hold a queue is refused.
    def test_attach_checks_header(self):
        fd, size, writer = self.area(1, 2, 64)
        writer._q32[Q.HEADER_OFFSETS["slot_size"] // 4] = 128
        with self.assertRaisesRegex(shmbroker.ShmBrokerError, "corrupt"):
            attach(fd, size)
        writer._q64[0] = 0
        with self.assertRaisesRegex(shmbroker.ShmBrokerError, "not a queue"):
            attach(fd, size)
