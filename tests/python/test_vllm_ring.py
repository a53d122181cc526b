# SPDX-License-Identifier: Apache-2.0
"""vLLM's ring interface on shmbroker.vllm.SingleWriterShmRingBuffer:
allocate_buf, access_buf, free_buf, clear, metadata and shared_memory, with
vLLM's accounting (a ring of data_buffer_size bytes, an 8-byte id and size
before each allocation, MemoryError when it is full, frees from the oldest),
the bytes of each allocation living in an object of the daemon.

Writers start private daemons ($SHMBROKER_SOCKET points where none listens),
except where a test says it uses a shared one.
"""

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import shmbroker  # noqa: E402
from shmbroker.vllm import SingleWriterShmRingBuffer  # noqa: E402

MD = SingleWriterShmRingBuffer.MD_SIZE


class RingTestCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="shmb-ring-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        env = mock.patch.dict(os.environ, {"SHMBROKER_SOCKET": os.path.join(self.tmp, "none.sock")})
        env.start()
        self.addCleanup(env.stop)

    def ring(self, size, **kw):
        ring = SingleWriterShmRingBuffer(data_buffer_size=size, create=True, **kw)
        self.addCleanup(ring.close)
        return ring

    def reader_of(self, ring):
        reader = SingleWriterShmRingBuffer(*ring.handle())
        self.addCleanup(reader.close)
        return reader


class RingInterfaceTest(RingTestCase):
    """The behaviours of vLLM's tests/distributed/test_shm_buffer.py."""

    # A reader opened from handle() is no writer and names the same memory.
    def test_buffer_opening(self):
        ring = self.ring(4096)
        reader = self.reader_of(ring)
        self.assertFalse(reader.is_writer)
        self.assertTrue(ring.is_writer)
        self.assertEqual(reader.shared_memory.name, ring.shared_memory.name)

    # What the writer writes through access_buf reads back, with the id
    # allocate_buf returned, for the writer and for a reader.
    def test_buffer_access(self):
        ring = self.ring(4096)
        address, monotonic_id = ring.allocate_buf(100)
        data = b"Hello, World!" * 7
        with ring.access_buf(address) as (buf, md):
            self.assertEqual(len(buf), 100)
            self.assertEqual(md, (monotonic_id, 100 + MD))
            buf[:len(data)] = data
        for r in (ring, self.reader_of(ring)):
            with r.access_buf(address) as (buf, md):
                self.assertEqual(bytes(buf[:len(data)]), data)
                self.assertEqual(md[0], monotonic_id)

    # 108 + 88 bytes fill a ring of 200: one more byte (9 with its id and
    # size) raises vLLM's MemoryError, and the ring is left as it was.
    def test_memory_error_on_full_buffer(self):
        ring = self.ring(200)
        self.assertEqual(ring.allocate_buf(100), (0, 0))
        self.assertEqual(ring.allocate_buf(80), (108, 1))
        with self.assertRaises(MemoryError) as cm:
            ring.allocate_buf(1)
        self.assertEqual(str(cm.exception), "Not enough space in the data buffer, try calling "
                         "free_buf() to free up space")
        self.assertEqual((ring.monotonic_id_end, ring.data_buffer_end), (2, 196))
        self.assertEqual(ring.metadata, {0: 0, 1: 108})

    # Allocate, free everything: each round's first freed id is that round's.
    def test_allocation_and_free(self):
        ring = self.ring(200)
        for i in range(5):
            address, monotonic_id = ring.allocate_buf(80)
            self.assertEqual(monotonic_id, i)
            with ring.access_buf(address) as (buf, _md):
                buf[0:4] = (0).to_bytes(4, "little")
                buf[4:22] = b"Repeated test data"
            freed = ring.free_buf(lambda *args: True)
            self.assertEqual(freed[0], i)
            self.assertEqual(list(freed), [i])
            self.assertEqual(ring.metadata, {})

    # clear() empties metadata and starts ids and positions again at 0.
    def test_clear_buffer(self):
        ring = self.ring(4096)
        for _ in range(3):
            ring.allocate_buf(100)
        ring.clear()
        self.assertEqual(len(ring.metadata), 0)
        self.assertEqual((ring.monotonic_id_start, ring.monotonic_id_end), (0, 0))
        self.assertEqual((ring.data_buffer_start, ring.data_buffer_end), (0, 0))
        self.assertEqual(ring.allocate_buf(100), (0, 0))

    # The fix vLLM's ring got (test_allocation_cycles): through many rounds of
    # allocations of random sizes and frees of the oldest, no allocation ever
    # overlaps a live one, the ring never takes more than its size, and every
    # live allocation keeps the bytes written to it, as a reader sees them.
    def test_allocation_cycles(self):
        size = 1000
        ring = self.ring(size)
        reader = self.reader_of(ring)
        rng = random.Random(25)
        live = {}  # id -> (address, bytes written)
        owner = [None] * size  # which live id holds each byte

        def allocate(n):
            try:
                address, monotonic_id = ring.allocate_buf(n)
            except MemoryError:
                return False
            total = n + MD
            start = address % size
            self.assertLessEqual(start + total, size, "an allocation runs past the ring's end")
            for i in range(start, start + total):
                self.assertIsNone(owner[i], "id %d at %d overlaps live id %s"
                                  % (monotonic_id, address, owner[i]))
                owner[i] = monotonic_id
            data = bytes(rng.randrange(256) for _ in range(n))
            with ring.access_buf(address) as (buf, md):
                buf[:] = data
                self.assertEqual(md, (monotonic_id, total))
            live[monotonic_id] = (address, data)
            return True

        def free(count):
            done = []

            def is_free(monotonic_id, buf):
                if len(done) >= count:
                    return False
                done.append(monotonic_id)
                return True
            freed = list(ring.free_buf(is_free))
            self.assertEqual(freed, done)
            for monotonic_id in freed:
                address, data = live.pop(monotonic_id)
                for i in range(address % size, address % size + len(data) + MD):
                    owner[i] = None

        refused = 0
        for _round in range(300):
            if not allocate(rng.randrange(1, 200)):
                refused += 1
                self.assertGreater(len(live), 0, "an empty ring refused an allocation")
                free(rng.randrange(1, 4))
            self.assertLessEqual(sum(len(d) + MD for _a, d in live.values()), size - 1)
            for monotonic_id, (address, data) in live.items():
                with reader.access_buf(address) as (buf, md):
                    self.assertEqual((md[0], bytes(buf)), (monotonic_id, data))
        self.assertGreater(refused, 10)  # the ring was full, many times

    # free_buf stops at the first allocation is_free_fn refuses, and with
    # nbytes stops once that many bytes are freed; the ring's start moves to
    # the oldest allocation left.
    def test_free_stops_at_the_oldest_in_use(self):
        ring = self.ring(4096)
        pairs = [ring.allocate_buf(100) for _ in range(4)]
        self.assertEqual(list(ring.free_buf(lambda i, buf: i != 1)), [0])
        self.assertEqual(ring.data_buffer_start, pairs[1][0])
        self.assertEqual(list(ring.free_buf(lambda i, buf: True, nbytes=1)), [1])
        self.assertEqual(sorted(ring.metadata), [2, 3])
        self.assertEqual(list(ring.free_buf(lambda i, buf: True)), [2, 3])
        self.assertEqual((ring.data_buffer_start, ring.data_buffer_end), (0, 0))

    # is_free_fn given to the ring is free_buf's check when it gets none.
    def test_is_free_fn_of_the_ring(self):
        seen = []
        ring = self.ring(4096, is_free_fn=lambda i, buf: seen.append(i) or True)
        ring.allocate_buf(10)
        self.assertEqual(list(ring.free_buf()), [0])
        self.assertEqual(seen, [0])

    # A reader's view of an address with no allocation is empty, with id -1.
    def test_access_of_nothing(self):
        ring = self.ring(4096)
        reader = self.reader_of(ring)
        with reader.access_buf(123) as (buf, md):
            self.assertEqual((len(buf), md), (0, (-1, 0)))

    # Freed allocations are gone from the daemon too; live ones are the
    # daemon's objects, pinned by the writer so that nothing evicts them.
    def test_allocations_are_daemon_objects(self):
        ring = self.ring(4096)
        ring.allocate_buf(100)
        ring.allocate_buf(100)
        objects = ring.client.list()
        self.assertEqual([(o["size"], o["pins"]) for o in objects], [(108, 1), (108, 1)])
        ring.free_buf(lambda i, buf: True)
        self.assertEqual(ring.client.list(), [])


    # Two writers of one ring name: the second's allocation where the first
    # holds one is refused, naming the ring; where the first's writer is
    # gone (nobody pins it), the leftover is replaced.
    def test_second_writer_of_a_name(self):
        name = "shmb-ring-%d" % os.getpid()
        first = self.ring(4096, name=name)
        second = self.ring(4096, name=name)
        first.allocate_buf(10)
        with self.assertRaises(ValueError) as cm:
            second.allocate_buf(10)
        self.assertIn("Ring '%s' has another writer" % name, str(cm.exception))
        with first.access_buf(0) as (buf, md):
            self.assertEqual(md, (0, 10 + MD))
        first.client.release(first._held[0].key)
        self.assertEqual(second.allocate_buf(20), (0, 0))
        with self.reader_of(second).access_buf(0) as (buf, md):
            self.assertEqual(md, (0, 20 + MD))


class RingSharedDaemonTest(RingTestCase):
    """A ring on a daemon other clients use."""

    # A writer killed with SIGKILL leaves its allocations unpinned: another
    # client of the daemon can then allocate their room.
    def test_killed_writer_leaves_room(self):
        with shmbroker.spawn_daemon(64 * 1024) as d:
            code = ("import sys; sys.path.insert(0, sys.argv[1]);"
                    "from shmbroker.vllm import SingleWriterShmRingBuffer as R;"
                    "r = R(60000, create=True, socket_path=sys.argv[2]);"
                    "r.allocate_buf(25000); r.allocate_buf(25000);"
                    "print('ready', flush=True); sys.stdin.read()")
            child = subprocess.Popen([sys.executable, "-c", code, PACKAGE_DIR, d.socket_path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self.addCleanup(child.stdout.close)
            self.addCleanup(child.stdin.close)
            self.addCleanup(child.wait)
            self.addCleanup(child.kill)
            self.assertEqual(child.stdout.readline().strip(), b"ready")
            with shmbroker.Client(d.socket_path) as c:
                with self.assertRaises(MemoryError):
                    c.put("big", b"x" * 25000)
                child.send_signal(signal.SIGKILL)
                child.wait()
                # The daemon tries again when it sees the connection close.
                c.put("big", b"x" * 25000, wait_ms=30000)

    # Two unnamed writer rings on one daemon keep apart; a reader from a
    # handle sees its own writer's allocations.
    def test_two_unnamed_rings(self):
        with shmbroker.spawn_daemon(256 * 1024) as d:
            r1 = self.ring(4096, socket_path=d.socket_path)
            r2 = self.ring(4096, socket_path=d.socket_path)
            a1 = r1.allocate_buf(10)
            a2 = r2.allocate_buf(20)
            self.assertEqual(a1, a2[:1] + (0,))
            for ring, n in ((r1, 10), (r2, 20)):
                with self.reader_of(ring).access_buf(0) as (buf, md):
                    self.assertEqual((len(buf), md), (n, (0, n + MD)))


if __name__ == "__main__":
    unittest.main()
