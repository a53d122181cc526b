# SPDX-License-Identifier: Apache-2.0
"""The broadcast queue's fast paths from Python: the readers' adaptive wait
(a reader that sees messages come in a rhythm naps through most of each gap
and spins across the next message; once they stop it sleeps on the futex
and uses no CPU), messages that are buffers sent out of band (bytes,
bytearray, memoryview, numpy arrays, CPU torch tensors: their bytes go
straight into the slot, and readers get the same type back, byte for byte),
such messages mixed with pickled ones in order, and a slot header scribbled
by a hostile member giving a clear error instead of a crash.

The wait tests use an area laid out by hand (test_queues.format_area), no
daemon; the message tests a real daemon with writer and reader in this
process. No test asserts a duration.
"""

import itertools
import multiprocessing
import os
import pickle
import pickletools
import random
import resource
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
from shmbroker import _futex, frames, queue as Q  # noqa: E402
from shmbroker import _queue_wait  # noqa: E402
from shmbroker import MessageQueue  # noqa: E402

from support import DaemonTest  # noqa: E402
from test_queues import attach, format_area, seat_take  # noqa: E402

CTX = multiprocessing.get_context("fork")
WAIT = 30.0
# The reader thread's own timer slack, which its naps must give back.
OWN_SLACK_NS = 70000

try:
    import numpy as np
except ImportError:
    np = None
try:
    import torch
except ImportError:
    torch = None


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def paced_reader(fd, size, epoch, count, results):
    """Read count messages, then wait for one more that comes after a
    pause; report the wait's counters and the CPU of the pause."""
    try:
        area = attach(fd, size, 0, epoch)
        _futex.timer_slack(OWN_SLACK_NS)
        for _ in range(count):
            area.dequeue(WAIT)
        naps, sleeps = area.naps, area.sleeps
        results.put(("read", (naps, _futex.timer_slack(), sleeps)))
        before = cpu_seconds()
        area.dequeue(WAIT)  # the writer pauses about 1 s before this one
        idle_cpu = cpu_seconds() - before
        area.done()
        results.put(("idle", (area.sleeps - sleeps, idle_cpu)))
    except BaseException as e:
        results.put(("read", "%s: %s" % (type(e).__name__, e)))


@unittest.skipUnless(_futex.supported, _futex.why_unsupported or "")
class AdaptiveWaitTest(unittest.TestCase):
    """The readers' wait between messages, over a hand-made area."""

    def run_paced(self, env, gap_s=0.002, count=150, with_busy=False):
        """A writer publishing count messages gap_s apart, then a last one
        after a pause of about a second, to a reader process started with
        env; returns (its naps, futex sleeps during the pause, the pause's
        CPU seconds)."""
        fd, size = format_area(1, 8, 64)
        self.addCleanup(os.close, fd)
        writer = attach(fd, size)
        self.addCleanup(writer.close)
        epoch = seat_take(writer, 0)
        results = CTX.Queue()
        with unittest.mock.patch.dict(os.environ, env):
            proc = CTX.Process(target=paced_reader, args=(fd, size, epoch, count, results))
            proc.start()
        self.addCleanup(proc.join, WAIT)
        due = time.monotonic()
        for _ in range(count):
            due += gap_s
            while time.monotonic() < due:
                time.sleep(max(0.0, due - time.monotonic() - 0.0003))
            writer.reserve(WAIT)[0].release()
            writer.publish(Q.SLOT_INLINE, 0)
        tag, got = results.get(timeout=WAIT)
        self.assertEqual(tag, "read")
        self.assertIsInstance(got, tuple, got)
        naps, slack, busy_sleeps = got
        # Each nap lowers the thread's timer slack and gives its own back.
        self.assertEqual(slack, OWN_SLACK_NS)
        time.sleep(1.0)
        writer.reserve(WAIT)[0].release()
        writer.publish(Q.SLOT_INLINE, 0)
        tag, (sleeps, idle_cpu) = results.get(timeout=WAIT)
        self.assertEqual(tag, "idle")
        if with_busy:
            return naps, busy_sleeps, (sleeps, idle_cpu)
        return naps, sleeps, idle_cpu

    # With SHMBROKER_QUEUE_WAIT=rhythm, messages every 2 ms: the reader
    # learns the gap and naps through most of
    # it (a timed futex wait ending ahead of the next message) instead of
    # spinning through it or sleeping until woken. When they stop, it sleeps
    # on the futex (no timer) and uses next to no CPU while the writer
    # pauses. Bounds are generous: a loaded machine breaks some rhythms.
    def test_reader_naps_in_a_rhythm_and_sleeps_when_it_stops(self):
        naps, sleeps, idle_cpu = self.run_paced({"SHMBROKER_QUEUE_WAIT": "rhythm"})
        sys.stdout.write("  150 messages 2 ms apart: %d naps; the 1 s pause: %d futex "
                         "sleeps, %.1f ms of CPU\n" % (naps, sleeps, idle_cpu * 1000))
        # Naps start once 8 gaps agree; a loaded machine breaks some
        # rhythms, and each break costs 8 more plain sleeps.
        self.assertGreaterEqual(naps, 10)
        self.assertGreaterEqual(sleeps, 1)
        self.assertLess(idle_cpu, 0.05)

    # The timer slack: set and read back; a negative value sets nothing.
    def test_timer_slack(self):
        own = _futex.timer_slack()
        self.addCleanup(_futex.timer_slack, own)
        _futex.timer_slack(12345)
        self.assertEqual(_futex.timer_slack(-1), 12345)
        self.assertEqual(_futex.timer_slack(own), 12345)
        self.assertEqual(_futex.timer_slack(), own)

    # The adaptive wait spins through gaps like those messages have been
    # coming at, within SHMBROKER_QUEUE_SPIN_MAX_US: with it at 5 ms and a
    # message every 1 ms, the reader almost never sleeps on the futex (the
    # short wait, 50 us at most, sleeps before each one); when the messages
    # stop, it sleeps after at most that bound. With naps off
    # (SHMBROKER_QUEUE_WAIT=sleep) a gap past the bound is a plain sleep.
    def test_reader_spins_through_steady_gaps_then_sleeps(self):
        count = 200
        naps, busy_sleeps, (sleeps, idle_cpu) = self.run_paced(
            {"SHMBROKER_QUEUE_SPIN_MAX_US": "5000", "SHMBROKER_QUEUE_WAIT": "sleep"},
            gap_s=0.001, count=count, with_busy=True)
        sys.stdout.write("  %d messages 1 ms apart: %d futex sleeps; the 1 s pause: %d "
                         "sleeps, %.1f ms of CPU\n" % (count, busy_sleeps, sleeps,
                                                        idle_cpu * 1000))
        self.assertEqual(naps, 0)
        self.assertLess(busy_sleeps, count // 2)
        self.assertGreaterEqual(sleeps, 1)
        self.assertLess(idle_cpu, 0.05)

    # SHMBROKER_QUEUE_WAIT=short turns the adaptive wait off: a short spin,
    # then a sleep until woken, never a nap.
    def test_short_wait_never_naps(self):
        naps, sleeps, idle_cpu = self.run_paced({"SHMBROKER_QUEUE_WAIT": "short"}, count=40)
        self.assertEqual(naps, 0)
        self.assertGreaterEqual(sleeps, 1)
        self.assertLess(idle_cpu, 0.05)

    # The knobs: values that cannot be used are logged and left at their
    # defaults; SHMBROKER_QUEUE_SPIN_MAX_US bounds a wait's spin.
    def test_wait_settings_from_environment(self):
        cases = [({}, (True, None, Q.SPIN_MAX_DEFAULT_US * 1000)),
                 ({"SHMBROKER_QUEUE_WAIT": "short"},
                  (False, False, Q.SPIN_MAX_DEFAULT_US * 1000)),
                 ({"SHMBROKER_QUEUE_SPIN_MAX_US": "250"}, (True, None, 250000)),
                 ({"SHMBROKER_QUEUE_SPIN_MAX_US": "0"}, (True, None, 0))]
        cases += [({"SHMBROKER_QUEUE_WAIT": "rhythm"}, (True, True, 100000)),
                  ({"SHMBROKER_QUEUE_WAIT": "sleep"}, (True, False, 100000))]
        for env, want in cases:
            with unittest.mock.patch.dict(os.environ, env):
                self.assertEqual(Q._wait_settings(), want, env)
        for env in ({"SHMBROKER_QUEUE_WAIT": "\udcff"}, {"SHMBROKER_QUEUE_SPIN_MAX_US": "-1"},
                    {"SHMBROKER_QUEUE_SPIN_MAX_US": "1e99"},
                    {"SHMBROKER_QUEUE_SPIN_MAX_US": str(10 ** 30)}):
            with unittest.mock.patch.dict(os.environ, env), \
                    self.assertLogs("shmbroker.queue", "WARNING"):
                self.assertEqual(Q._wait_settings(),
                                 (True, None, Q.SPIN_MAX_DEFAULT_US * 1000))

    # The default wait naps through a rhythm where the writer and every live
    # reader can each have a CPU (here 1 reader, and 2 CPUs as far as the
    # reader knows), and never where they cannot (1 CPU): there its spins
    # ahead of a message would take the CPU from the writer.
    def test_default_naps_only_where_members_fit_the_cpus(self):
        with unittest.mock.patch.object(os, "sched_getaffinity", return_value={0, 1}):
            naps, sleeps, idle_cpu = self.run_paced({})
        self.assertGreaterEqual(naps, 10)
        self.assertGreaterEqual(sleeps, 1)
        self.assertLess(idle_cpu, 0.05)
        with unittest.mock.patch.object(os, "sched_getaffinity", return_value={0}):
            naps, sleeps, idle_cpu = self.run_paced({}, count=40)
        self.assertEqual(naps, 0)
        self.assertGreaterEqual(sleeps, 1)
        # SHMBROKER_QUEUE_WAIT=sleep: never a nap, whatever the CPUs.
        with unittest.mock.patch.object(os, "sched_getaffinity", return_value={0, 1}):
            naps, sleeps, idle_cpu = self.run_paced({"SHMBROKER_QUEUE_WAIT": "sleep"},
                                                    count=40)
        self.assertEqual(naps, 0)


@unittest.skipUnless(_futex.supported, _futex.why_unsupported or "")
class WriterMarkTest(unittest.TestCase):
    """The writer's sleep for a free slot, over a hand-made area."""

    def wait_for(self, what, cond):
        end = time.monotonic() + WAIT
        while not cond():
            self.assertLess(time.monotonic(), end, what)
            time.sleep(0.001)

    # A writer woken at its mark by a reader ahead of the slowest (its slot
    # still held) sleeps to the same mark again: the fast reader's further
    # reads make no futex wake, and the slowest reader's reaching the mark
    # lets it publish. Before, the second sleep had no mark and every read
    # of any reader woke the writer.
    def test_writer_woken_early_sleeps_to_its_mark_again(self):
        fd, size = format_area(2, 4, 64)
        self.addCleanup(os.close, fd)
        writer = attach(fd, size)
        self.addCleanup(writer.close)
        fast = attach(fd, size, 0, seat_take(writer, 0))
        slow = attach(fd, size, 1, seat_take(writer, 1))
        self.addCleanup(fast.close)
        self.addCleanup(slow.close)
        for _ in range(4):
            writer.reserve(WAIT)[0].release()
            writer.publish(Q.SLOT_INLINE, 0)
        errors = []

        def write_one():
            try:
                writer.reserve(WAIT)[0].release()
                writer.publish(Q.SLOT_INLINE, 0)
            except BaseException as e:
                errors.append(e)
        asleep = lambda: writer._q32[Q.HEADER_OFFSETS["writer_waiting"] // 4] == 1  # noqa
        wake_at = lambda: writer._q64[Q.HEADER_OFFSETS["wake_at"] // 8]  # noqa
        # Marked sleeps that do not end on their own within the test.
        with unittest.mock.patch.object(_queue_wait, "_MARK_SLEEP_NS", int(WAIT * 1e9)):
            t = threading.Thread(target=write_one)
            t.start()
            self.addCleanup(t.join, WAIT)
            self.wait_for("the writer's first sleep", lambda: writer.sleeps == 1 and asleep())
            self.assertEqual(wake_at(), 2)  # half the ring of 4 read
            for _ in range(2):  # messages 0 and 1: the second reaches the mark
                fast.dequeue(WAIT)
            fast.done()
            self.wait_for("the writer's second sleep", lambda: writer.sleeps == 2 and asleep())
            self.assertEqual(wake_at(), 2)
            wakes = []
            real_wake = _futex.futex_wake
            with unittest.mock.patch.object(
                    _futex, "futex_wake", lambda *a: (wakes.append(a), real_wake(*a))[1]):
                for _ in range(2):  # messages 2 and 3, past the mark
                    fast.dequeue(WAIT)
                fast.done()
            self.assertEqual(wakes, [])
            for _ in range(2):  # the slowest reads 0 and 1: the writer goes on
                slow.dequeue(WAIT)
            slow.done()
            t.join(WAIT)
        self.assertFalse(t.is_alive())
        self.assertEqual(errors, [])
        self.assertEqual(writer.published(), 5)


def buffer_messages():
    """(name, message) of every kind of buffer, small and large."""
    rng = random.Random(7)
    out = [("bytes small", b"abc"), ("bytes", rng.randbytes(5000)),
           ("bytes empty", b""), ("bytearray", bytearray(rng.randbytes(3000))),
           ("memoryview", memoryview(rng.randbytes(4096))),
           ("memoryview 2-D doubles", memoryview(rng.randbytes(8 * 60)).cast("d", [6, 10])),
           ("memoryview strided", memoryview(rng.randbytes(2000))[::3]),
           ("bytes larger than a slot", rng.randbytes(200 * 1024))]
    if np is not None:
        out += [("numpy float32 2-D", np.arange(600, dtype=np.float32).reshape(20, 30)),
                ("numpy int16 Fortran", np.asfortranarray(
                    np.arange(120, dtype=np.int16).reshape(10, 12))),
                ("numpy larger than a slot", np.arange(40000, dtype=np.float64))]
    if torch is not None:
        out += [("torch bfloat16 3-D", torch.arange(60, dtype=torch.bfloat16).reshape(3, 4, 5)),
                ("torch int64", torch.arange(1000, dtype=torch.int64)),
                ("torch empty", torch.zeros((0, 7), dtype=torch.float16)),
                ("torch transposed", torch.arange(12.0).reshape(3, 4).t())]
    return out


def same(test, name, want, got):
    """got is want: the same type, bytes, and dtype/format and shape."""
    test.assertIs(type(got), type(want), name)
    if isinstance(want, (bytes, bytearray)):
        test.assertEqual(got, want, name)
    elif isinstance(want, memoryview):
        test.assertEqual((got.format, got.shape), (want.format, want.shape), name)
        test.assertEqual(got.tobytes(), want.tobytes(), name)
        test.assertFalse(got.readonly, name)
    elif np is not None and isinstance(want, np.ndarray):
        test.assertEqual((got.dtype, got.shape), (want.dtype, want.shape), name)
        test.assertTrue(np.array_equal(got, want), name)
        test.assertTrue(got.flags.writeable, name)
    elif torch is not None and isinstance(want, torch.Tensor):
        test.assertEqual((got.dtype, got.shape), (want.dtype, want.shape), name)
        test.assertTrue(torch.equal(got, want), name)
    else:
        test.assertEqual(got, want, name)


@unittest.skipUnless(_futex.supported, _futex.why_unsupported or "")
class BufferMessageTest(DaemonTest):
    """Messages that are buffers, through a real daemon."""

    DAEMON_SIZE = "16M"
    SLOT = 64 * 1024

    def pair(self, slots=4):
        mq = MessageQueue(1, socket_path=self.d.socket_path, max_chunk_bytes=self.SLOT,
                          max_chunks=slots)
        self.addCleanup(mq.close)
        reader = MessageQueue.create_from_handle(mq.export_handle(), 0)
        self.addCleanup(reader.close)
        reader.wait_until_ready(WAIT)
        mq.wait_until_ready(WAIT)
        return mq, reader

    def slot_frames(self, mq, n):
        """The frames of message n in the writer's view of its slot."""
        area = mq._area
        flags, length = Q.SLOT.unpack_from(area._mv, area._slot_at(n))[1:3]
        self.assertEqual(flags, Q.SLOT_INLINE)
        off = area._slot_at(n) + Q.SLOT_HEADER
        return frames.parse(area._mv[off:off + length])

    # The stream of a buffer message names its rebuild call where
    # PROTOCOL.md section 9 says it is, shmbroker.queue, whichever file holds
    # the code: readers of other versions of the package look it up there,
    # and recognise the streams of bytes and bytearray by their bytes.
    def test_rebuild_calls_are_named_in_shmbroker_queue(self):
        cases = [(Q._message_frames(bytes(4096))[0], "_rebuild_bytes"),
                 (Q._message_frames(bytearray(4096))[0], "_rebuild_bytearray"),
                 (Q._message_frames(memoryview(bytearray(4096)).cast("I"))[0],
                  "_rebuild_memoryview"),
                 (Q._oob_frames(Q._rebuild_tensor, b"", ("float32", (0,)))[0],
                  "_rebuild_tensor")]
        for stream, name in cases:
            strings = [arg for _, arg, _ in pickletools.genops(bytes(stream))
                       if isinstance(arg, str)]
            self.assertEqual(strings[:2], ["shmbroker.queue", name])

    # Each kind of buffer comes back as the same type with the same bytes,
    # dtype (format) and shape; those of 1 KiB and more travel out of band:
    # their bytes are the slot's second frame, not inside a pickle. One of
    # each is larger than a slot (an overflow object).
    def test_buffers_round_trip_out_of_band(self):
        if np is None or torch is None:
            sys.stdout.write("  (numpy %s, torch %s: their cases are left out)\n"
                             % ("absent" if np is None else "present",
                                "absent" if torch is None else "present"))
        mq, reader = self.pair()
        for name, msg in buffer_messages():
            n = mq._area.published()
            mq.enqueue(msg)
            size = memoryview(msg).nbytes if not _is_tensor(msg) else \
                msg.numel() * msg.element_size()
            if size >= 1024 and size < self.SLOT - 256:
                got_frames = self.slot_frames(mq, n)
                self.assertEqual(len(got_frames), 2, name)
                raw = msg.contiguous().numpy().tobytes() if _is_tensor(msg) else \
                    memoryview(msg).tobytes(order="A" if np is not None
                                            and isinstance(msg, np.ndarray) else None)
                self.assertEqual(got_frames[1].tobytes(), raw, name)
            same(self, name, msg, reader.dequeue(timeout=WAIT))

    # Pickled messages and buffers interleave, in and out of slots, and every
    # one arrives in order.
    def test_mixed_messages_in_order(self):
        mq, reader = self.pair(slots=3)
        rng = random.Random(11)
        kinds = buffer_messages() + [("dict", {"step": 1, "data": b"x" * 3000}),
                                     ("list", [1, 2.5, "three"]), ("none", None),
                                     ("big dict", {"blob": rng.randbytes(100 * 1024)})]
        order = [kinds[rng.randrange(len(kinds))] for _ in range(120)]
        for i, (name, msg) in enumerate(order):
            mq.enqueue(msg)
            same(self, "%d %s" % (i, name), msg, reader.dequeue(timeout=WAIT))

    # A member that scribbles the slot header (or the frames header inside
    # it) makes the reader raise a clear error naming the corruption; the
    # reader does not crash, and the queue's other members are not touched.
    def test_scribbled_slot_header_is_a_clear_error(self):
        mq, reader = self.pair()
        area = mq._area
        scribbles = [("seq", 0, (1 << 64) - 1, "Q"), ("flags", 8, 7, "I"),
                     ("len", 12, 0xFFFFFFFF, "I"), ("len", 12, 3, "I"),
                     ("magic", 64, 0, "Q"),
                     ("frames count", 72, 0xFFFFFFFF, "I"),
                     ("frame length", 80, (1 << 63), "Q")]
        # A buffer out of band (two frames), and a small pickle (one frame,
        # written and read in place).
        for (name, off, value, fmt), msg in itertools.product(
                scribbles, (bytes(5000), ("small", 1, bytes(64)))):
            n = area.published()
            mq.enqueue(msg)
            self.assertEqual(len(self.slot_frames(mq, n)), 2 if type(msg) is bytes else 1)
            at = area._slot_at(n) + off
            area._mv[at:at + (8 if fmt == "Q" else 4)] = value.to_bytes(
                8 if fmt == "Q" else 4, "little")
            with self.assertRaises(shmbroker.ShmBrokerError, msg=name) as cm:
                reader.dequeue(timeout=WAIT)
            self.assertRegex(str(cm.exception), "corrupt|frames|layout|payload", name)
            # Past the bad message: the seat moves on by hand, as a reader
            # that gives up on it would reopen its seat.
            reader._area._q64[reader._area._i_next] = n + 1
        mq.enqueue(b"after")
        self.assertEqual(reader.dequeue(timeout=WAIT), b"after")

    # A small pickle goes into its slot in place when its frame fits the
    # slot (to the last byte), else as an overflow object, and a stream of
    # DIRECT_MIN or more by the general path; each arrives intact and in
    # order, whatever the slot's size.
    def test_small_pickles_at_the_slot_edge(self):
        from shmbroker import _queue_codec as C
        for slot in (64, 256, self.SLOT):
            mq = MessageQueue(1, socket_path=self.d.socket_path, max_chunk_bytes=slot,
                              max_chunks=2)
            self.addCleanup(mq.close)
            reader = MessageQueue.create_from_handle(mq.export_handle(), 0)
            self.addCleanup(reader.close)
            reader.wait_until_ready(WAIT)
            mq.wait_until_ready(WAIT)
            base = len(pickle.dumps(("", 0), protocol=5))
            for room in (slot - C._ONE_FRAME_AT - 1, slot - C._ONE_FRAME_AT,
                         slot - C._ONE_FRAME_AT + 1, C.DIRECT_MIN - 1, C.DIRECT_MIN):
                fill = max(0, room - base)
                for i in range(3):  # around the ring, over the objects before
                    msg = ("x" * fill, i)
                    n = mq._area.published()
                    mq.enqueue(msg)
                    flags = Q.SLOT.unpack_from(mq._area._mv, mq._area._slot_at(n))[1]
                    fits = C._ONE_FRAME_AT + len(pickle.dumps(msg, protocol=5)) <= slot
                    self.assertEqual(flags, Q.SLOT_INLINE if fits else Q.SLOT_OBJECT,
                                     (slot, room))
                    self.assertEqual(reader.dequeue(timeout=WAIT), msg, (slot, room))

    # A rebuild whose format, dtype or shape does not fit its bytes (a
    # scribbled stream) is a clear error, not a crash or a TypeError.
    def test_rebuild_that_does_not_fit_is_a_clear_error(self):
        cases = [(Q._rebuild_memoryview, ("d", (3,))), (Q._rebuild_memoryview, ("Zq", (1,))),
                 (Q._rebuild_memoryview, ("B", (9,)))]
        if torch is not None:
            cases += [(Q._rebuild_tensor, ("float32", (3,))),
                      (Q._rebuild_tensor, ("__class__", (2,))),
                      (Q._rebuild_tensor, ("float64", (-5, 2)))]
        for rebuild, args in cases:
            stream = pickle.dumps(Q._OutOfBand(rebuild, b"\0" * 8, args), protocol=5,
                                  buffer_callback=lambda b: None)
            with self.assertRaisesRegex(shmbroker.ShmBrokerError, "corrupt", msg=args):
                pickle.loads(stream, buffers=[bytearray(8)])

    # A hostile or scribbled stream's rebuild arguments that no writer of
    # this module makes (a shape that is not a tuple of non-negative ints,
    # a dimension past 2**63, a dtype that is not a name, a tensor of no
    # bytes whose shape has elements) are a clear error naming the message,
    # never a TypeError, an OverflowError, or an object of bytes nobody sent.
    def test_hostile_rebuild_arguments_are_a_clear_error(self):
        cases = [(Q._rebuild_memoryview, b"\0" * 8, ("B", 8)),
                 (Q._rebuild_memoryview, b"\0" * 8, ("B", None)),
                 (Q._rebuild_memoryview, b"\0" * 8, ("B", (1 << 70,))),
                 (Q._rebuild_memoryview, b"\0" * 8, ("B", (True,) * 8))]
        if torch is not None:
            cases += [(Q._rebuild_tensor, b"\0" * 8, (5, (2,))),
                      (Q._rebuild_tensor, b"\0" * 8, (None, (2,))),
                      (Q._rebuild_tensor, b"\0" * 8, ("float32", 2)),
                      (Q._rebuild_tensor, b"\0" * 8, ("float32", (-1,))),
                      (Q._rebuild_tensor, b"", ("float32", (1 << 20, 256))),
                      (Q._rebuild_tensor, b"", ("float64", ()))]
        for rebuild, buf, args in cases:
            stream = pickle.dumps(Q._OutOfBand(rebuild, buf, args), protocol=5,
                                  buffer_callback=lambda b: None)
            with self.assertRaisesRegex(shmbroker.ShmBrokerError, "corrupt", msg=args):
                pickle.loads(stream, buffers=[bytearray(buf)])

    # The same through a real queue: a writer that sends a tensor message of
    # no bytes and a shape of a gibibyte gives its reader EIO each time it
    # reads it (the message stays at the seat, as vLLM's); past it, the
    # reader reads on.
    @unittest.skipUnless(torch is not None, "needs torch")
    def test_hostile_tensor_message_through_the_queue(self):
        mq, reader = self.pair()
        n = mq._area.published()
        mq.enqueue(Q._OutOfBand(Q._rebuild_tensor, b"", ("float32", (1 << 20, 256))))
        mq.enqueue(b"after")
        for _ in range(2):
            with self.assertRaisesRegex(shmbroker.ShmBrokerError,
                                        "no bytes.*1048576, 256") as cm:
                reader.dequeue(timeout=WAIT)
            self.assertEqual(cm.exception.code, "EIO")
        reader._area._q64[reader._area._i_next] = n + 1
        self.assertEqual(reader.dequeue(timeout=WAIT), b"after")

    # A tensor message read where torch cannot be imported says so.
    def test_tensor_without_torch_says_so(self):
        stream = pickle.dumps(Q._OutOfBand(Q._rebuild_tensor, b"\0" * 8, ("float32", (2,))),
                              protocol=5, buffer_callback=lambda b: None)
        with unittest.mock.patch.dict(sys.modules, {"torch": None}):
            with self.assertRaisesRegex(shmbroker.Unsupported, "torch cannot be imported"):
                pickle.loads(stream, buffers=[bytearray(8)])


class TwoFrameFastPathTest(unittest.TestCase):
    """A message of two frames (a buffer out of band and its stream) is laid
    out and read without frames.py's general code, byte for byte as it."""

    # Laying out and reading two frames of every length around the 64-byte
    # boundaries gives frames.write's bytes and frames.parse's views,
    # without calling either; a header whose lengths do not add up to the
    # payload goes to frames.parse, which refuses it as before.
    def test_two_frames_as_the_general_layout(self):
        lengths = [0, 1, 31, 32, 33, 63, 64, 65, 127, 4096]
        for n0 in lengths:
            for n1 in lengths:
                bufs = [memoryview(bytes(range(256)) * 17)[:n0],
                        memoryview(b"\xab" * n1)]
                total = frames.layout([n0, n1])[2]
                self.assertEqual(Q._message_size(bufs), total, (n0, n1))
                slow = bytearray(b"\xee" * total)
                frames.write(memoryview(slow), bufs)
                fast = bytearray(b"\xee" * total)
                with unittest.mock.patch.object(frames, "write", side_effect=AssertionError), \
                        unittest.mock.patch.object(frames, "parse",
                                                   side_effect=AssertionError):
                    Q._write_message(memoryview(fast), bufs)
                    got = Q._read_message(memoryview(fast))
                self.assertEqual(fast, slow, (n0, n1))
                self.assertEqual([g.tobytes() for g in got],
                                 [f.tobytes() for f in frames.parse(memoryview(slow))],
                                 (n0, n1))
                self.assertTrue(all(g.readonly for g in got))
        bad = bytearray(frames.layout([10, 100])[2])
        Q._write_message(memoryview(bad), [memoryview(bytes(10)), memoryview(bytes(100))])
        for at, value in ((16, 11), (16, 65), (16, 1 << 63), (24, 99), (24, (1 << 64) - 1),
                          (8, 3), (12, 1)):
            scribbled = memoryview(bytearray(bad))
            scribbled[at:at + 8 if at >= 16 else at + 4] = value.to_bytes(
                8 if at >= 16 else 4, "little")
            try:
                want = [f.tobytes() for f in frames.parse(scribbled)]
            except shmbroker.ProtocolError:
                with self.assertRaises(shmbroker.ProtocolError, msg=(at, value)):
                    Q._read_message(scribbled)
                continue
            self.assertEqual([g.tobytes() for g in Q._read_message(scribbled)], want)
        self.assertRaises(shmbroker.ProtocolError, Q._read_message,
                          memoryview(bad)[:len(bad) - 1])


class OneFrameInPlaceTest(unittest.TestCase):
    """A small pickled message, one frame, is written into its slot and read
    from it in place, byte for byte as frames.py's general code has it."""

    # The writer's 64 bytes before the frame are frames.write's header and
    # zeros; the reader's in-place decoding, at any offset of the mapping,
    # gives what pickle gives, without frames.parse; a header that does not
    # describe exactly one frame of the payload's length goes to
    # frames.parse, which refuses it.
    def test_one_frame_as_the_general_layout(self):
        from shmbroker import _queue_codec as C
        msgs = [None, 0, "x" * 100, (0, 1, 0, bytes(64)), (0, 1, 0, bytes(4096)),
                {"a": [1, 2.5]}, ""]
        for msg in msgs:
            stream = pickle.dumps(msg, protocol=5)
            total = C._ONE_FRAME_AT + len(stream)
            slow = bytearray(b"\xee" * total)
            frames.write(memoryview(slow), [memoryview(stream)])
            fast = bytearray(b"\xee" * total)
            C._ONE_FRAME_HEADER.pack_into(fast, 0, frames.MAGIC, 1, 0, len(stream))
            fast[C._ONE_FRAME_AT:] = stream
            self.assertEqual(fast, slow, msg)
            mapping = memoryview(bytearray(b"\xee" * 64) + fast + b"\xee" * 64)
            with unittest.mock.patch.object(frames, "parse", side_effect=AssertionError):
                self.assertEqual(C._decode_at(mapping, 64, total), msg)
        stream = pickle.dumps(msgs[3], protocol=5)
        n, total = len(stream), C._ONE_FRAME_AT + len(stream)
        good = bytearray(total)
        frames.write(memoryview(good), [memoryview(stream)])
        for at, value, size in ((0, 0, 8), (8, 0xFFFFFFFF, 4), (12, 1, 4), (16, n + 1, 8),
                                (16, n - 1, 8), (16, 1 << 63, 8)):
            scribbled = bytearray(good)
            scribbled[at:at + size] = value.to_bytes(size, "little")
            with self.assertRaises(shmbroker.ProtocolError, msg=(at, value)):
                C._decode_at(memoryview(scribbled), 0, total)
        self.assertRaises(shmbroker.ProtocolError, C._decode_at, memoryview(good), 0, total - 1)


@unittest.skipUnless(_futex.supported, _futex.why_unsupported or "")
class PickledIntoSlotTest(DaemonTest):
    """A writer whose last pickled message was large (DIRECT_MIN or more,
    and fitted a slot) pickles the next one straight into its slot, with no
    stream of its own; a small or oversized one sends it back to
    pickle.dumps. Whichever way, readers get the same messages in order."""

    DAEMON_SIZE = BufferMessageTest.DAEMON_SIZE
    SLOT = BufferMessageTest.SLOT
    pair = BufferMessageTest.pair
    slot_frames = BufferMessageTest.slot_frames

    def counted(self):
        """Counters of the two ways a pickled message is written."""
        from shmbroker import _queue_messages
        calls = {"dumps": 0, "into": 0}

        def dumps(obj, *args, _real=_queue_messages._dumps, **kwargs):
            calls["dumps"] += 1
            return _real(obj, *args, **kwargs)

        def into(view, obj, _real=_queue_messages._pickle_into):
            calls["into"] += 1
            return _real(view, obj)

        for name, fake in (("_dumps", dumps), ("_pickle_into", into)):
            patch = unittest.mock.patch.object(_queue_messages, name, fake)
            patch.start()
            self.addCleanup(patch.stop)
        return calls

    def send(self, mq, reader, msgs):
        for i, msg in enumerate(msgs):
            mq.enqueue(msg)
            got = reader.dequeue(timeout=WAIT)
            if np is not None and isinstance(msg, tuple) and any(
                    isinstance(m, np.ndarray) for m in msg):
                self.assertEqual(len(got), len(msg), i)
                for a, b in zip(msg, got):
                    self.assertTrue(np.array_equal(a, b) if isinstance(a, np.ndarray)
                                    else a == b, i)
            else:
                self.assertEqual(got, msg, i)

    # After one large message, the next large ones skip pickle.dumps; the
    # slot holds them in the frames layout, byte for byte what dumps'
    # stream unpickles to.
    def test_large_messages_pickled_into_their_slot(self):
        mq, reader = self.pair()
        calls = self.counted()
        big = [("step", i, os.urandom(40 * 1024)) for i in range(4)]
        for i, msg in enumerate(big):
            n = mq._area.published()
            mq.enqueue(msg)
            parts = self.slot_frames(mq, n)
            self.assertEqual(len(parts), 1, i)
            self.assertEqual(pickle.loads(parts[0]), msg, i)
            self.assertEqual(reader.dequeue(timeout=WAIT), msg, i)
        self.assertEqual(calls, {"dumps": 1, "into": 3})

    # A small message after large ones goes into its slot too (nobody knows
    # its size before pickling it) and sends the next back to dumps; so does
    # one that does not fit a slot, which becomes an overflow object.
    def test_small_and_oversized_messages_go_back_to_dumps(self):
        mq, reader = self.pair()
        calls = self.counted()
        self.send(mq, reader, [("a", os.urandom(40 * 1024)), ("b", os.urandom(40 * 1024)),
                               "small", "small again"])
        self.assertEqual(calls, {"dumps": 2, "into": 2})
        self.send(mq, reader, [("c", os.urandom(40 * 1024)),
                               ("too big", os.urandom(3 * self.SLOT)),
                               ("d", os.urandom(40 * 1024))])
        # c by dumps, the one too big pickled once, begun in its slot and
        # sent as an overflow object, d by dumps again (the last did not fit).
        self.assertEqual(calls, {"dumps": 4, "into": 3})
        self.send(mq, reader, [("e", os.urandom(40 * 1024))])
        self.assertEqual(calls, {"dumps": 4, "into": 4})

    # Out-of-band buffers (numpy arrays) follow the stream in the slot as
    # frames 1 and on; more than a 64-byte header lists go by dumps.
    @unittest.skipIf(np is None, "numpy is not installed")
    def test_out_of_band_buffers_after_the_stream(self):
        mq, reader = self.pair()
        calls = self.counted()
        two = ("two", os.urandom(40 * 1024), np.arange(1000.0), np.arange(7, dtype=np.int8))
        self.send(mq, reader, [("warm", os.urandom(40 * 1024))])
        n = mq._area.published()
        self.send(mq, reader, [two])
        self.assertEqual(len(self.slot_frames(mq, n)), 3)
        self.assertEqual(calls, {"dumps": 1, "into": 1})
        six = tuple([os.urandom(40 * 1024)] + [np.arange(i + 1.0) for i in range(6)])
        self.send(mq, reader, [six, two, two])
        # six pickled once, in its slot, then sent as frames; the first two
        # after it by dumps, the second two in its slot again.
        self.assertEqual(calls, {"dumps": 2, "into": 3})

    # A message is pickled once whichever way it goes: one larger than the
    # slot, or with more out-of-band buffers than the slot's header lists,
    # is sent from the pickling begun in the slot, not pickled again (a
    # __reduce__ need not give the same twice: here each call numbers its
    # result, and a second pickling sent the wrong number).
    def test_a_message_is_pickled_once(self):
        mq, reader = self.pair()
        msgs = [("warm", _Counted(), os.urandom(40 * 1024)),
                ("too big", _Counted(), os.urandom(3 * self.SLOT)),
                ("warm again", _Counted(), os.urandom(40 * 1024))]
        if np is not None:
            msgs.append(tuple(["six buffers", _Counted(), os.urandom(40 * 1024)]
                              + [np.arange(i + 1.0) for i in range(6)]))
        for msg in msgs:
            before = _Counted.calls
            mq.enqueue(msg)
            self.assertEqual(_Counted.calls, before + 1, msg[0])
            got = reader.dequeue(timeout=WAIT)
            self.assertEqual(got[:3], (msg[0], before + 1, msg[2]), msg[0])

    # A message pickle refuses, pickled into its slot, raises as pickle
    # raises and publishes nothing; the queue goes on.
    def test_unpicklable_message_publishes_nothing(self):
        mq, reader = self.pair()
        self.send(mq, reader, [("warm", os.urandom(40 * 1024))])
        n = mq._area.published()
        with self.assertRaises((pickle.PicklingError, AttributeError, TypeError)):
            mq.enqueue(("local", lambda: 0))
        self.assertEqual(mq._area.published(), n)
        self.send(mq, reader, [("after", os.urandom(40 * 1024)), "then small"])



class _Counted:
    """Pickles as the number of times any was pickled so far."""

    calls = 0

    def __reduce__(self):
        _Counted.calls += 1
        return int, (_Counted.calls,)


def _is_tensor(obj):
    return torch is not None and isinstance(obj, torch.Tensor)


if __name__ == "__main__":
    unittest.main()
