# SPDX-License-Identifier: Apache-2.0
"""The reader's wait for messages that come in a rhythm: after RHYTHM_GAPS
gaps that agree, it sleeps (a timed futex wait, "a nap") until just ahead
of the next expected message, asking to wake its timer's learnt lateness
early, then polls until the message is there; when the rhythm breaks (a gap
far longer than learnt) it sleeps on the futex until the writer wakes it;
a poll that spends its CPU budget ends in that sleep too.

_Rhythm's arithmetic is tested alone; the wait over an area laid out by
hand (test_queues.format_area), writer and reader in this process, with
the reader's clocks, its sched_yield and its futex wait stood in for by a
FakeHost that runs the writer's schedule: what the tests assert is what
the wait does (its naps' ends, its polls, its futex sleeps), never how long
anything took.
"""

import os
import sys
import threading
import unittest
import unittest.mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE_DIR = os.path.join(ROOT, "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

from shmbroker import _futex, queue as Q  # noqa: E402
from shmbroker import _queue_rhythm as R  # noqa: E402
from shmbroker import _queue_wait  # noqa: E402
from shmbroker.errors import Timeout  # noqa: E402

from test_queues import attach, format_area, seat_take  # noqa: E402

US = 1000
GAP = 200 * US
WAIT = 5.0


class FakeHost:
    """The reader's clocks, sched_yield and futex wait, and a writer that
    publishes a message at each time of `due` (fake monotonic ns). Each
    look at the clock costs look_ns of time and CPU; a yield yield_ns of
    each; a timed futex wait wakes `late` ns after its deadline, or
    wake_ns after the writer publishes, whichever comes first, and its
    wake-up costs wake_cpu_ns of CPU. Every futex wait's deadline is kept in
    `waits`."""

    def __init__(self, publish, late=40 * US, wake_ns=40 * US, look_ns=500,
                 yield_ns=1 * US, wake_cpu_ns=30 * US):
        self.publish = publish
        self.late, self.wake_ns, self.look_ns = late, wake_ns, look_ns
        self.yield_ns, self.wake_cpu_ns = yield_ns, wake_cpu_ns
        self.t = 10 ** 12
        self.cpu = 0
        self.due = []
        self.waits = []
        self.yields = 0

    def _arrive(self):
        while self.due and self.due[0] <= self.t:
            self.due.pop(0)
            self.publish()

    def now(self):
        self.t += self.look_ns
        self.cpu += self.look_ns
        self._arrive()
        return self.t

    def thread_time(self):
        return self.cpu

    def sched_yield(self):
        self.yields += 1
        self.t += self.yield_ns
        self.cpu += self.yield_ns
        self._arrive()

    def futex_wait(self, addr, val, deadline=None):
        self.waits.append(deadline)
        ends = []
        if deadline is not None:
            ends.append(max(self.t, deadline + self.late))
        if self.due:
            ends.append(max(self.t, self.due[0] + self.wake_ns))
        if not ends:
            raise AssertionError("a futex wait for ever with no message to come")
        self.t = min(ends)
        self.cpu += self.wake_cpu_ns
        self._arrive()

    def patches(self):
        return [unittest.mock.patch.object(_queue_wait, "_now", self.now),
                unittest.mock.patch.object(_queue_wait, "_thread_time", self.thread_time),
                unittest.mock.patch.object(_queue_wait, "_sched_yield", self.sched_yield),
                unittest.mock.patch.object(_futex, "futex_wait", self.futex_wait)]


class RhythmTest(unittest.TestCase):
    """_Rhythm alone: what it learns and what it plans."""

    def steady(self, gaps, start=10 ** 12):
        r = R._Rhythm()
        t = start
        r.arrived(t, 0)
        for g in gaps:
            t += g
            r.arrived(t, t - 1 * US)
        return r, t

    # A rhythm is planned through only after RHYTHM_GAPS gaps that agree;
    # then the nap ends the lead and the timer's lateness ahead of the
    # next expected message, and the poll goes on past it by a part of the
    # gap.
    def test_plan_after_a_rhythm(self):
        r, t = self.steady([GAP] * (R.RHYTHM_GAPS - 1))
        self.assertIsNone(r.plan(t + 10 * US))
        r.arrived(t + GAP, t + GAP - 1 * US)
        t += GAP
        wake, until = r.plan(t + 10 * US)
        self.assertEqual(r.gap(), GAP)
        self.assertEqual(wake, t + GAP - R.LEAD_START_NS - R.LATE_START_NS)
        self.assertEqual(until, t + GAP + GAP // R.TAIL_PARTS)

    # Gaps that do not agree (a quarter of them twice the others) are no
    # rhythm; gaps shorter than GAP_MIN_NS (back to back) are none either.
    def test_no_rhythm_of_scattered_or_short_gaps(self):
        r, t = self.steady([GAP, GAP, GAP, 2 * GAP] * 4)
        self.assertFalse(r.steady())
        self.assertIsNone(r.plan(t + 10 * US))
        r, t = self.steady([R.GAP_MIN_NS // 2] * 20)
        self.assertFalse(r.steady())
        self.assertEqual(r.gap(), 0)

    # The gap is the median of those kept: a writer whose own wake-ups are
    # late now and then makes some gaps long (here 3 in 16, by 150 us),
    # and they do not move it (their mean would be 28 us longer).
    def test_estimate_is_the_median(self):
        r, t = self.steady([GAP] * 13 + [GAP + 150 * US] * 3)
        self.assertTrue(r.steady())
        self.assertEqual(r.gap(), GAP)
        # Sightings 30 us early or late in turn: not their lower quartile,
        # which would wake every nap 30 us early.
        r, t = self.steady([GAP - 30 * US, GAP, GAP + 30 * US] * 6)
        self.assertEqual(r.gap(), GAP)

    # The next message is expected where the newest messages put it, not
    # the last one alone: one that came 100 us late (found by a poll, so
    # taken as when it came) leaves the next expected on the rhythm.
    def test_one_late_message_keeps_the_phase(self):
        r, t = self.steady([GAP] * R.RHYTHM_GAPS)
        r.arrived(t + GAP + 100 * US, t + GAP + 99 * US)
        self.assertEqual(r.anchor, t + GAP + 100 * US)
        wake, _ = r.plan(t + GAP + 110 * US)
        self.assertEqual(wake, t + 2 * GAP - r.lead - r.lateness())

    # The timer's lateness is learnt (the median of the newest), and the
    # nap asks to wake that much earlier.
    def test_lateness_learnt_and_subtracted(self):
        r, t = self.steady([GAP] * R.RHYTHM_GAPS)
        for late in (30 * US, 70 * US, 70 * US, 70 * US, 500 * US):
            r.overshoot(late)
        self.assertEqual(r.lateness(), 70 * US)
        wake, _ = r.plan(t + 10 * US)
        self.assertEqual(wake, t + GAP - r.lead - 70 * US)

    # A gap far longer than learnt (the writer paused) breaks the rhythm:
    # it is learnt again from the next gaps, and the lateness with it.
    def test_long_gap_breaks_the_rhythm(self):
        r, t = self.steady([GAP] * R.RHYTHM_GAPS)
        r.overshoot(80 * US)
        t += (R.BREAK_TIMES + 1) * GAP
        r.arrived(t, t - 1 * US)
        self.assertFalse(r.steady())
        self.assertIsNone(r.plan(t + 10 * US))
        self.assertEqual(r.lateness(), R.LATE_START_NS)
        self.assertEqual(r.breaks, 1)

    # A message seen late (the reader was asleep when it came) is taken to
    # have come when the rhythm expected it, if that is between the last
    # empty look and when it was there: the rhythm does not drift by the
    # reader's own lateness.
    def test_late_sighting_keeps_the_rhythm_phase(self):
        r, t = self.steady([GAP] * R.RHYTHM_GAPS)
        r.arrived(t + GAP + 50 * US, t + 20 * US)
        self.assertEqual(r.anchor, t + GAP)
        self.assertEqual(r.gap(), GAP)

    # The lead moves earlier after a message that was there at the wake,
    # later after one that found the reader polling, and later whatever
    # happened while the waits' mean CPU is over the budget.
    def test_lead_follows_outcomes_and_budget(self):
        r, t = self.steady([GAP] * R.RHYTHM_GAPS)
        lead = r.lead
        r.outcome(R.LATE, 10 * US)
        self.assertEqual(r.lead, lead + R.LEAD_UP_NS)
        r.outcome(R.EARLY, 10 * US)
        self.assertEqual(r.lead, lead + R.LEAD_UP_NS - R.LEAD_DOWN_NS)
        lead = r.lead
        for _ in range(40):
            r.outcome(R.LATE, GAP)  # every wait spends a whole gap of CPU
        self.assertLess(r.lead, lead)
        self.assertEqual(r.lead, 0)


@unittest.skipUnless(_futex.supported, _futex.why_unsupported or "")
class RhythmWaitTest(unittest.TestCase):
    """The reader's wait over a hand-made area, on a FakeHost."""

    def setUp(self):
        fd, size = format_area(1, 8, 64)
        self.addCleanup(os.close, fd)
        self.writer = attach(fd, size)
        self.addCleanup(self.writer.close)
        epoch = seat_take(self.writer, 0)
        with unittest.mock.patch.dict(os.environ, {"SHMBROKER_QUEUE_WAIT": "rhythm",
                                                   "SHMBROKER_QUEUE_SPIN_MAX_US": "100"}):
            self.reader = attach(fd, size, 0, epoch)
        self.addCleanup(self.reader.close)
        self.host = FakeHost(self.publish)
        for p in self.host.patches():
            p.start()
            self.addCleanup(p.stop)

    def publish(self):
        self.writer.reserve(WAIT)[0].release()
        self.writer.publish(Q.SLOT_INLINE, 0)

    def read(self, gaps, cancel=None):
        """The writer publishes a message after each of gaps (ns, from the
        last one); the reader dequeues each (with cancel), working 5 us on
        it."""
        host = self.host
        t = getattr(self, "last_due", host.t)
        for g in gaps:
            t += g
            host.due.append(t)
        self.last_due = t
        for _ in gaps:
            self.reader.dequeue(WAIT, cancel)
            host.t += 5 * US
        self.reader.done()

    def counts(self):
        a = self.reader
        return a.naps, a.sleeps, a.rhythm_polls, len(self.host.waits)

    # Before RHYTHM_GAPS gaps no wait naps: each sleeps on the futex until
    # the writer wakes it. After them, and a few naps that find where the
    # messages come (those sleeps saw each one a wake-up late), each wait
    # makes one timed futex wait that ends ahead of the message by at least
    # the timer's learnt lateness and after the message before, then
    # polls, and finds the message without a futex sleep.
    def test_naps_until_just_before_the_next_then_polls(self):
        self.read([GAP] * (R.RHYTHM_GAPS + 1))  # the first one starts the rhythm
        naps, sleeps, polls, waits = self.counts()
        self.assertEqual(naps, 0)
        self.assertGreaterEqual(sleeps, R.RHYTHM_GAPS)
        self.assertTrue(self.reader._rhythm.steady())
        self.read([GAP] * 8)
        polled = 0
        for _ in range(20):
            before = self.last_due
            naps, sleeps, polls, waits = self.counts()
            self.read([GAP])
            due = before + GAP
            self.assertEqual(self.counts()[:2], (naps + 1, sleeps))
            self.assertEqual(len(self.host.waits), waits + 1)
            end = self.host.waits[-1]
            lateness = self.reader._rhythm.lateness()
            # (give or take the looks at the clock: 2 us)
            self.assertLess(end, due - lateness + 2 * US)
            self.assertGreater(end, before)
            polled += self.reader.rhythm_polls - polls
        # About a quarter of the naps end as their message comes (no poll
        # after them): the lead is kept where a quarter of them do, so
        # that the others poll only a few microseconds.
        self.assertGreaterEqual(polled, 12)
        # The timer's lateness the host has (40 us) is what it learnt, with
        # the look at the clock after it.
        self.assertEqual(self.reader._rhythm.lateness(), self.host.late + self.host.look_ns)

    # A timer later than first guessed (120 us) is learnt: the naps ask to
    # wake that much earlier, and still find the message by polling.
    def test_learns_a_late_timer(self):
        self.host.late = 120 * US
        self.read([GAP] * (R.RHYTHM_GAPS + 40))
        # Within 10 us (a nap the writer woke says less of its timer), and
        # a look at the clock.
        self.assertGreaterEqual(self.reader._rhythm.lateness(), 110 * US)
        self.assertLessEqual(self.reader._rhythm.lateness(), 121 * US)
        naps, sleeps, polls, waits = self.counts()
        before = self.last_due
        self.read([GAP])
        self.assertEqual(self.counts()[:2], (naps + 1, sleeps))
        self.assertLessEqual(self.host.waits[-1], before + GAP - 110 * US)

    # The rhythm breaks (the writer pauses for ten gaps): the wait that
    # expected the message polls to its end, then sleeps on the futex
    # until the writer wakes it; the rhythm is learnt again, and the
    # waits that follow sleep on the futex, no nap, until RHYTHM_GAPS gaps
    # agree again.
    def test_broken_rhythm_sleeps_on_the_futex(self):
        self.read([GAP] * (R.RHYTHM_GAPS + 4))
        naps, sleeps, polls, waits = self.counts()
        self.read([10 * GAP])
        self.assertEqual(self.counts()[:3], (naps + 1, sleeps + 1, polls + 1))
        self.assertFalse(self.reader._rhythm.steady())
        naps, sleeps, polls, waits = self.counts()
        self.read([GAP] * (R.RHYTHM_GAPS - 1))
        self.assertEqual(self.counts()[0], naps)
        self.assertGreaterEqual(self.counts()[1], sleeps + R.RHYTHM_GAPS - 1)
        self.read([GAP] * 3)
        self.assertGreater(self.counts()[0], naps)

    # The CPU budget stops the poll: with SHMBROKER_QUEUE_SPIN_MAX_US=20
    # (the budget, below a quarter of the gap), a message that comes late
    # (while the rhythm still holds) is polled for until the poll has spent
    # 20 us of CPU, not until the poll's end (a quarter of a gap past the
    # expected time); then the reader sleeps on the futex.
    def test_cpu_budget_stops_the_poll(self):
        self.reader.spin_max_ns = 20 * US
        self.read([GAP] * (R.RHYTHM_GAPS + 4))
        naps, sleeps, polls, waits = self.counts()
        cpu, yields = self.host.cpu, self.host.yields
        self.read([GAP + GAP // 2])
        self.assertEqual(self.counts()[:3], (naps + 1, sleeps + 1, polls + 1))
        polled = (self.host.yields - yields) * (self.host.yield_ns + self.host.look_ns)
        self.assertGreater(polled, 0)
        # Within the budget, give or take the 4 looks between two looks at
        # the CPU clock.
        self.assertLessEqual(polled, 20 * US + 4 * (self.host.yield_ns + self.host.look_ns))

    # A wait given a cancel event looks at it every _CANCEL_POLL_NS while
    # asleep, and a nap does not look: in a rhythm of 20 ms gaps, such a
    # wait never naps; without the event, it does.
    def test_no_long_nap_with_a_cancel_event(self):
        gap = 2 * Q._CANCEL_POLL_NS
        self.read([gap] * (R.RHYTHM_GAPS + 8), cancel=threading.Event())
        self.assertEqual(self.reader.naps, 0)
        self.read([gap] * 4)
        self.assertGreater(self.reader.naps, 0)

    # A wait's timeout holds in a rhythm: a dequeue that may wait 50 us,
    # its message a gap away, naps no later than its deadline and raises
    # Timeout, and the next message is still read.
    def test_timeout_within_a_rhythm(self):
        self.read([GAP] * (R.RHYTHM_GAPS + 4))
        start = self.host.t
        with self.assertRaises(Timeout):
            self.reader.dequeue(50e-6)
        self.assertLessEqual(self.host.waits[-1], start + 60 * US)
        self.read([GAP])

    # A reader whose waits may not nap (SHMBROKER_QUEUE_WAIT=sleep, or by
    # default while the writer and its readers do not each have a CPU)
    # does not learn the rhythm, which would cost it microseconds per
    # message for nothing; once it may nap, it learns the rhythm afresh
    # (no gap across the messages it was not learning) and naps through it.
    def test_rhythm_learnt_only_where_naps_may_be(self):
        reader = self.reader
        self.read([GAP] * (R.RHYTHM_GAPS + 4))
        self.assertTrue(reader._rhythm.steady())
        reader.naps_on = False
        self.read([GAP] * (R.RHYTHM_GAPS + 4))
        self.assertEqual(reader._rhythm.gaps, [])
        self.assertFalse(reader._rhythm.steady())
        naps = reader.naps
        reader.naps_on, reader._cpus, reader._fit_looks = None, 1, 0  # 2 members, 1 CPU
        self.read([GAP] * (R.RHYTHM_GAPS + 4))
        self.assertEqual(reader._rhythm.gaps, [])
        self.assertEqual(reader.naps, naps)
        reader._cpus, reader._fit_looks = 2, 0
        naps = reader.naps
        self.read([GAP] * 2)
        self.assertEqual(reader._rhythm.gaps, [GAP])
        self.read([GAP] * (R.RHYTHM_GAPS + 8))
        self.assertTrue(reader._rhythm.steady())
        self.assertGreater(reader.naps, naps)

    # Without a spin budget (SHMBROKER_QUEUE_SPIN_MAX_US=0) the reader
    # never naps: each wait sleeps on the futex until woken.
    def test_no_nap_without_a_budget(self):
        self.reader.spin_max_ns = 0
        self.read([GAP] * (R.RHYTHM_GAPS + 8))
        self.assertEqual(self.reader.naps, 0)
        self.assertEqual(self.reader.rhythm_polls, 0)


if __name__ == "__main__":
    unittest.main()
