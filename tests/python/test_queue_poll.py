# SPDX-License-Identifier: Apache-2.0
"""The reader's wait while messages come back to back: a reader that found
its message already published (it is behind the writer) polls for the next
ones, yielding the CPU between looks, within a CPU budget
(SHMBROKER_QUEUE_SPIN_MAX_US of its own CPU, and ten times that of wall
time), and only then sleeps on the futex.

Over an area laid out by hand (test_queues.format_area), writer and reader
in this process. The reader's clocks and its sched_yield are stood in for,
so that each yield "lets other processes run" for a set time and a set CPU:
what the tests assert is what the wait does (how many yields, polls and
futex sleeps), never how long anything took.
"""

import os
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

from shmbroker import _futex, queue as Q  # noqa: E402
from shmbroker import _queue_wait  # noqa: E402  (the waits' clocks, patched)
from shmbroker.errors import Cancelled, Timeout  # noqa: E402

from test_queues import attach, format_area, seat_take, set_state  # noqa: E402

WAIT = 5.0
US = 1000


class FakeTime:
    """A yield that stands for other processes running: each call moves the
    wall clock on by wall_ns and this thread's CPU by cpu_ns, and at the
    call numbered publish_at (from 1) runs publish(). The wall clock is the
    real one plus what the yields added, so real deadlines still hold."""

    def __init__(self, wall_ns, cpu_ns, publish_at=None, publish=None):
        self.wall_ns, self.cpu_ns = wall_ns, cpu_ns
        self.publish_at, self.publish = publish_at, publish
        self.added = 0
        self.cpu = 0
        self.calls = 0

    def now(self):
        return Q.time.monotonic_ns() + self.added

    def thread_time(self):
        return self.cpu

    def sched_yield(self):
        self.calls += 1
        self.added += self.wall_ns
        self.cpu += self.cpu_ns
        if self.calls == self.publish_at:
            self.publish()

    def patches(self):
        return [unittest.mock.patch.object(_queue_wait, "_now", self.now),
                unittest.mock.patch.object(_queue_wait, "_thread_time", self.thread_time),
                unittest.mock.patch.object(_queue_wait, "_sched_yield", self.sched_yield)]


@unittest.skipUnless(_futex.supported, _futex.why_unsupported or "")
class BackToBackPollTest(unittest.TestCase):
    """A reader behind its writer polls, yielding, before it sleeps."""

    def setUp(self):
        fd, size = format_area(1, 8, 64)
        self.addCleanup(os.close, fd)
        self.writer = attach(fd, size)
        self.addCleanup(self.writer.close)
        epoch = seat_take(self.writer, 0)
        with unittest.mock.patch.dict(os.environ, {"SHMBROKER_QUEUE_WAIT": "adaptive",
                                                   "SHMBROKER_QUEUE_SPIN_MAX_US": "100"}):
            self.reader = attach(fd, size, 0, epoch)
        self.addCleanup(self.reader.close)

    def publish(self):
        self.writer.reserve(WAIT)[0].release()
        self.writer.publish(Q.SLOT_INLINE, 0)

    def read_behind(self, gap_ns=10 * US):
        """Two messages published before the reader looks: it is behind the
        writer, and finds each there at once; its messages have been coming
        gap_ns apart on average (as it learnt them)."""
        self.publish()
        self.publish()
        self.reader._gap = gap_ns
        for _ in range(2):
            self.reader.dequeue(WAIT)
        self.reader.done()

    def dequeue_with(self, fake, timeout=WAIT):
        patches = fake.patches()
        for p in patches:
            p.start()
        try:
            return self.reader.dequeue(timeout)
        finally:
            for p in reversed(patches):
                p.stop()

    # Behind the writer, while other processes hold the CPU (each yield:
    # 50 us of wall time, 1 us of the reader's CPU), the reader keeps
    # polling past its 100 us spin bound, and takes the message that comes
    # at the fifth yield without a futex sleep (the writer needs no wake).
    def test_reader_behind_polls_through_others_turns(self):
        self.read_behind()
        fake = FakeTime(50 * US, 1 * US, publish_at=5, publish=self.publish)
        self.dequeue_with(fake)
        self.assertEqual(self.reader.sleeps, 0)
        self.assertEqual(self.reader.polls, 1)
        self.assertEqual(fake.calls, 5)
        self.assertEqual(self.reader.yields, 5)

    # On a CPU of its own (each yield returns at once: 10 us of wall time
    # and 10 us of CPU), the poll ends once it spent its 100 us of CPU, and
    # the reader sleeps on the futex until its timeout: no message came.
    def test_poll_ends_at_its_cpu_budget_then_sleeps(self):
        self.read_behind()
        fake = FakeTime(10 * US, 10 * US)
        with self.assertRaises(Timeout):
            self.dequeue_with(fake, timeout=0.3)
        self.assertEqual(self.reader.polls, 1)
        self.assertGreaterEqual(self.reader.sleeps, 1)
        # 100 us of CPU at 10 us a yield: ten yields, and no more.
        self.assertGreaterEqual(fake.calls, 9)
        self.assertLessEqual(fake.calls, 11)

    # While other processes take all the CPU (each yield 100 us of wall
    # time, none of the reader's), the poll still ends: at ten times the
    # budget of wall time (1 ms, ten yields), then a futex sleep.
    def test_poll_ends_at_its_wall_bound(self):
        self.read_behind()
        fake = FakeTime(100 * US, 0)
        with self.assertRaises(Timeout):
            self.dequeue_with(fake, timeout=0.3)
        self.assertEqual(self.reader.polls, 1)
        self.assertGreaterEqual(self.reader.sleeps, 1)
        self.assertLessEqual(fake.calls, 11)
        # The poll that ran out ends the back-to-back mode: the next wait is
        # the ordinary one, which sleeps without a poll.
        polls = self.reader.polls
        with self.assertRaises(Timeout):
            self.dequeue_with(FakeTime(100 * US, 0), timeout=0.05)
        self.assertEqual(self.reader.polls, polls)

    # A reader that had to wait for its last message (not behind: the
    # writer paces them) does not poll for the next: a paced reader's CPU
    # stays what it was. Each message is published only once the reader
    # sleeps on the futex for it (its seat's waiting flag).
    def test_reader_not_behind_does_not_poll(self):
        waiting = Q.HEADER_PAGE + Q.SEAT_OFFSETS["waiting"]
        for _ in range(3):
            def publish_when_asleep():
                give_up = time.monotonic() + WAIT
                while self.writer._q32[waiting // 4] != 1 and time.monotonic() < give_up:
                    time.sleep(0.001)
                self.publish()
            t = threading.Thread(target=publish_when_asleep)
            t.start()
            try:
                self.reader.dequeue(WAIT)
                self.reader.done()
            finally:
                t.join()
        self.assertGreaterEqual(self.reader.sleeps + self.reader.naps, 3)
        self.assertEqual(self.reader.polls, 0)

    # Polls that keep running out (here each of 16 behind-waits ends in a
    # futex sleep: no message came) cost more than they save: the reader
    # stops polling for a while, and a wait found behind again sleeps
    # without a poll.
    def test_polls_that_run_out_are_turned_off(self):
        for _ in range(Q._POLL_WINDOW):
            self.read_behind()
            with self.assertRaises(Timeout):
                self.dequeue_with(FakeTime(100 * US, 0), timeout=0.01)
        self.assertEqual(self.reader.polls, Q._POLL_WINDOW)
        self.read_behind()
        with self.assertRaises(Timeout):
            self.dequeue_with(FakeTime(100 * US, 0), timeout=0.01)
        self.assertEqual(self.reader.polls, Q._POLL_WINDOW)

    # The writer held back by a reader polls the same way: while the
    # reader runs (each yield 50 us of wall time, 1 us of the writer's
    # CPU) it keeps looking past its spin, and takes the slot the reader
    # frees at the fifth yield without a futex sleep (no wake needed).
    def test_writer_held_back_polls_through_the_readers_turns(self):
        for _ in range(self.writer.slots):
            self.publish()

        def read_one():
            self.reader.dequeue(WAIT)
            self.reader.done()
        fake = FakeTime(50 * US, 1 * US, publish_at=5, publish=read_one)
        patches = fake.patches()
        for p in patches:
            p.start()
        try:
            self.writer.reserve(WAIT)[0].release()
        finally:
            for p in reversed(patches):
                p.stop()
        self.assertEqual(self.writer.sleeps, 0)
        self.assertEqual(self.writer.polls, 1)
        self.assertEqual(fake.calls, 5)

    # A message found published alone (a paced reader that woke late, not
    # one behind a stream) does not make the reader poll for the next.
    def test_one_message_waiting_is_not_behind(self):
        for _ in range(3):
            self.publish()
            self.reader.dequeue(WAIT)
            self.reader.done()
            with self.assertRaises(Timeout):
                self.dequeue_with(FakeTime(100 * US, 0), timeout=0.01)
        self.assertEqual(self.reader.polls, 0)

    # Behind, but its messages come further apart than the spin bound on
    # average (a paced reader that fell behind): no poll, since its yields
    # would only hand the CPU to whatever else runs.
    def test_behind_a_slow_rhythm_does_not_poll(self):
        self.read_behind(gap_ns=200 * US)
        with self.assertRaises(Timeout):
            self.dequeue_with(FakeTime(100 * US, 0), timeout=0.01)
        self.assertEqual(self.reader.polls, 0)

    # The queue shut down while a reader polls: the poll ends at its next
    # look with Cancelled, as a sleep would, without sleeping first.
    def test_shutdown_during_a_poll_cancels_it(self):
        self.read_behind()
        fake = FakeTime(50 * US, 1 * US, publish_at=3,
                        publish=lambda: set_state(self.writer, Q.QUEUE_SHUTDOWN))
        with self.assertRaises(Cancelled):
            self.dequeue_with(fake)
        self.assertEqual((self.reader.polls, self.reader.sleeps), (1, 0))
        self.assertEqual(fake.calls, 3)

    # SHMBROKER_QUEUE_SPIN_MAX_US=0 (no spin) leaves no CPU to poll with,
    # and SHMBROKER_QUEUE_WAIT=short turns the adaptive wait off: neither
    # polls when behind.
    # The same for the writer held back by its reader.
    def test_no_poll_without_a_budget_or_the_adaptive_wait(self):
        for env in ({"SHMBROKER_QUEUE_SPIN_MAX_US": "0"}, {"SHMBROKER_QUEUE_WAIT": "short"}):
            fd, size = format_area(1, 8, 64)
            self.addCleanup(os.close, fd)
            with unittest.mock.patch.dict(os.environ, env):
                self.writer = attach(fd, size)
                self.addCleanup(self.writer.close)
                epoch = seat_take(self.writer, 0)
                self.reader = attach(fd, size, 0, epoch)
            self.addCleanup(self.reader.close)
            self.read_behind()
            with self.assertRaises(Timeout):
                self.dequeue_with(FakeTime(50 * US, 1 * US), timeout=0.05)
            self.assertEqual(self.reader.polls, 0, env)
            for _ in range(self.writer.slots):
                self.publish()
            patches = FakeTime(50 * US, 1 * US).patches()
            for p in patches:
                p.start()
            try:
                with self.assertRaises(Timeout):
                    self.writer.reserve(0.05)
            finally:
                for p in reversed(patches):
                    p.stop()
            self.assertEqual(self.writer.polls, 0, env)


if __name__ == "__main__":
    unittest.main()
