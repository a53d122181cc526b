# SPDX-License-Identifier: Apache-2.0
"""What a queue's reader learns of its messages' rhythm: when each one came,
the gap between them, how late its own timed sleeps wake, and from those,
when to sleep until and how long to poll for the next message.

_Rhythm is plain arithmetic on times the caller gives it (monotonic ns): it
reads no clock, sleeps on nothing and knows nothing of the area. The wait
that uses it is _queue_wait's.
"""

# Gaps between messages kept for the estimate (the newest ones), and how
# many in a row a rhythm needs before the reader naps through it.
GAPS_KEPT = 16
RHYTHM_GAPS = 8
# A rhythm's gaps agree: the upper quartile of those kept is at most this
# many quarters of the lower one.
SPREAD_QUARTERS = 6
# The next message is expected where the newest PHASE_KEPT messages, each
# carried forward by the gap, put it: the lower quartile of those times (one
# message seen late, or a writer late once, does not move it).
PHASE_KEPT = 8
# A gap longer than this many times the estimate breaks the rhythm (the
# writer paused), as does any gap of _GAP_MAX_NS or more.
BREAK_TIMES = 3
GAP_MAX_NS = 100000000
# Gaps shorter than this are back to back, no rhythm to nap through (the
# spin and the poll of _queue_wait cover them): they break it, at the cost
# of a comparison per message.
GAP_MIN_NS = 50000
# Timed sleeps' lateness kept (the newest), and the guess before the first.
LATE_KEPT = 16
LATE_START_NS = 50000
# How far ahead of the expected message the reader aims to be awake: the
# first guess; a message already there at the wake moves it earlier by
# LEAD_UP_NS, one that finds the reader polling moves it later by
# LEAD_DOWN_NS, so that about LEAD_DOWN / (LEAD_UP + LEAD_DOWN) of the
# messages (a quarter) come before the reader is awake and the rest find it
# polling, a few microseconds ahead.
LEAD_START_NS = 10000
LEAD_UP_NS = 3000
LEAD_DOWN_NS = 1000
# The reader's CPU for one wait (its wake-up, its poll) is at most this part
# of the gap: a quarter of a CPU while paced. A poll that reaches it ends,
# and the reader sleeps on the futex until the writer wakes it.
BUDGET_PARTS = 4
# A poll goes on this part of the gap past the expected time (the writer's
# own wake-ups are late now and then), within the budget.
TAIL_PARTS = 4

# For n messages kept, how many gaps ahead each is of the next one.
_STEPS = [tuple(range(n, 0, -1)) for n in range(PHASE_KEPT + 1)]

# What a rhythm wait came to (outcome()).
EARLY, LATE, MISSED, OVER = "early", "late", "missed", "over budget"


class _Rhythm:
    """A reader's learnt rhythm. arrived() is told of each message, overshoot()
    of each timed sleep that ran out, outcome() of each wait plan() planned."""

    def __init__(self):
        self.gaps = []        # the newest gaps (ns) since the rhythm last broke
        self.est = 0          # their median (gap()), 0: none
        self.times = []       # when the newest messages came, as well as known
        self.want = 0         # when the next one is expected (0: not known)
        self.agree = False    # steady(), as of the last gap
        self.late = []        # the newest lateness of timed sleeps (ns)
        self.anchor = 0       # when the last message came, as well as known
        self.lead = LEAD_START_NS
        self.cpu = 0          # the mean CPU of a planned wait (ns)
        self.breaks = 0       # rhythms broken (tests and benchmarks look)

    def gap(self):
        """The gap between messages: the median of those kept (a message
        seen late makes one gap long and the next short; a writer's late
        wake-up the same), or 0 while none is known."""
        return self.est

    def steady(self):
        """True when the last RHYTHM_GAPS gaps or more agree."""
        return self.agree

    def _learn(self, g):
        """Keep gap g; the estimate and whether the gaps agree follow."""
        gaps = self.gaps
        gaps.append(g)
        if len(gaps) > GAPS_KEPT:
            del gaps[0]
        n = len(gaps)
        v = sorted(gaps)
        self.est = v[n // 2]
        self.agree = n >= RHYTHM_GAPS and 4 * v[(3 * n) // 4] <= SPREAD_QUARTERS * v[n // 4]

    def arrived(self, now, empty_at):
        """A message is there at now; the reader last looked and found
        nothing at empty_at. It came between the two: where the rhythm
        expected it within them, it is taken to have come then (a reader
        woken late would otherwise shift the rhythm by its own lateness),
        else at now."""
        last, want = self.anchor, self.want
        at = now
        if want and empty_at <= want <= now:
            at = want
        self.anchor = at
        g = at - last
        if not last or g < GAP_MIN_NS or g >= GAP_MAX_NS or (
                self.agree and g > BREAK_TIMES * self.est):
            # The first message, back to back, or a pause: no gap of a
            # rhythm. Learn it again (back to back, nothing to forget: two
            # comparisons per message).
            if self.gaps:
                self.forget()
            self.times = [at]
            return
        times = self.times
        times.append(at)
        if len(times) > PHASE_KEPT:
            del times[0]
        self._learn(g)
        est, n = self.est, len(times)
        ahead = sorted([t + k * est for t, k in zip(times, _STEPS[n])])
        self.want = ahead[n // 4]

    def forget(self):
        """The rhythm broke: its gaps, and the lateness of sleeps of their
        length, are learnt again."""
        if self.gaps:
            self.breaks += 1
        self.gaps = []
        self.est = 0
        self.want = 0
        self.agree = False
        self.late = []

    def pause(self):
        """The reader stops learning (it may not nap meanwhile): what it
        learnt is dropped, and the next message it is told of is a first
        one, not the end of a gap across the messages it was not told of."""
        self.gaps = []
        self.est = 0
        self.want = 0
        self.agree = False
        self.late = []
        self.times = []
        self.anchor = 0

    def overshoot(self, ns):
        """A timed sleep woke ns after it asked to."""
        self.late.append(max(0, ns))
        if len(self.late) > LATE_KEPT:
            del self.late[0]

    def lateness(self):
        """How late a timed sleep wakes: the median of those kept."""
        if not self.late:
            return LATE_START_NS
        v = sorted(self.late)
        return v[len(v) // 2]

    def budget(self):
        """The CPU one wait of the rhythm may spend (ns)."""
        return self.gap() // BUDGET_PARTS

    def plan(self, now):
        """For a wait starting at now with no message there: (wake, until),
        a timed sleep's end (asked that much ahead for the sleep's own
        lateness) and the end of the poll after it, or None where the reader
        should sleep until woken (no rhythm, or the message is long
        overdue)."""
        if not self.steady():
            return None
        g, want = self.est, self.want
        until = want + g // TAIL_PARTS
        if now >= until:
            return None
        lead = max(0, min(self.lead, self.budget()))
        return want - lead - self.lateness(), until

    def outcome(self, what, cpu):
        """What the planned wait came to: EARLY (the reader was polling when
        the message came), LATE (it was there when the sleep ended, or the
        writer woke the sleep), MISSED (the poll ran to its end) or OVER (it
        ran out of CPU budget); cpu: the wait's CPU (ns), its wake-up with
        it. The lead follows, earlier after a LATE one, later after the
        others, and later too while the waits' mean CPU is over budget."""
        self.cpu += (cpu - self.cpu) >> 3
        over = self.cpu > self.budget()
        if what == LATE and not over:
            self.lead += LEAD_UP_NS
        elif what == EARLY and not over:
            self.lead -= LEAD_DOWN_NS
        else:
            self.lead -= LEAD_UP_NS
        self.lead = max(0, min(self.lead, self.budget()))
