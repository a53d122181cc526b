# SPDX-License-Identifier: Apache-2.0
"""The waits of a queue's area: the writer's for a free slot and a reader's
for a message, as proto/queue.c's wait_for (a spin, then futex waits that
lose no wake-up), with the readers' adaptive wait (naps ahead of a message
that comes in a rhythm, polls while behind the writer) and its settings
from the environment.

_Waiting is mixed into _Area (_queue_area), whose fields it reads and
writes; the mapping, the slots and the seats' turns are _Area's. It knows
nothing of messages or of the daemon (check_daemon, set by the
MessageQueue, is how a long wait looks at its connection).
"""

import logging
import os
import time

from . import _futex
from ._queue_rhythm import EARLY, LATE, MISSED, OVER
from ._queue_layout import (QUEUE_OPEN, QUEUE_SHUTDOWN, QUEUE_WRITER_GONE,
                            SEAT_LIVE, _H, _cancelled, _closed_meanwhile, _corrupt,
                            _stopped_here)
from .errors import ConnectionLost, EndOfQueue, Timeout

# The waits log as the queue they belong to (logger shmbroker.queue, as
# documented), not under this module's name.
_log = logging.getLogger("shmbroker.queue")

# The adaptive spin before a futex wait, as proto/queue.c's (nanoseconds):
# doubled when a wait ends while spinning, halved when it had to sleep.
SPIN_MIN_NS = 1000
SPIN_START_NS = 20000
SPIN_LIMIT_US = 100000  # shmb_queue_set_spin's bound (SHMB_Q_SPIN_MAX_NS)
SPIN_MAX_NS = 50000

# The readers' adaptive wait (PROTOCOL.md section 9, "Waiting"; README): a
# reader spins through gaps like those its messages have been coming at,
# while that is within SHMBROKER_QUEUE_SPIN_MAX_US (default 100 us, at most
# SPIN_LIMIT_US: the CPU a reader may spend per wait), else it sleeps.
# SHMBROKER_QUEUE_WAIT=short turns it off (the spin above, then a sleep).
# Naps through a rhythm (_queue_rhythm learns it; _rhythm_wait): by default
# when the writer and every live reader can each have a CPU of this
# process's (with 4 readers on 2 CPUs their polls ahead of the message
# would crowd the CPUs); =rhythm always, =sleep never.
_WAIT_ENV = "SHMBROKER_QUEUE_WAIT"
_SPIN_MAX_ENV = "SHMBROKER_QUEUE_SPIN_MAX_US"
SPIN_MAX_DEFAULT_US = 100
# Pure spin this long, then yield the CPU between looks.
_SPIN_PAUSE_NS = 3000
# The nap's timer slack: a microsecond, so that it ends when asked.
_NAP_SLACK_NS = 1000
# Waits between two counts of the live seats (SHMBROKER_QUEUE_WAIT=adaptive).
_FIT_LOOKS = 64
# A gap this long is a pause, not a rhythm.
_GAP_MAX_NS = 100000000
_sched_yield = os.sched_yield
# Back to back: a reader that found _POLL_AHEAD messages already published
# (it is behind the writer), its messages coming within the spin bound of
# each other on average, polls for the next ones, yielding the CPU between
# looks, for this many waits, each within its CPU budget (spin_max_ns of
# this thread's CPU, and at most _POLL_WALL_PARTS times that of wall time),
# before it sleeps on the futex. While more members than CPUs share the machine, a
# yield hands the CPU to the writer or a slower reader, so the poll costs
# little CPU and saves the writer a futex wake per message; on an idle CPU
# it ends once its budget is spent.
_POLL_WAITS = 8
_POLL_AHEAD = 2
_POLL_WALL_PARTS = 10
# Polls are judged by windows of this many; when most of a window's ran out
# and slept, the next _POLLS_OFF_FOR waits do not poll.
_POLL_WINDOW = 16
_POLLS_OFF_FOR = 512
_thread_time = time.thread_time_ns
_MINUS_ONE = 0xFFFFFFFF  # fetch_add32 of -1
# A wait longer than this is cut into slices of it; between slices a member
# looks at its daemon connection, so that a daemon that died (SIGKILL, no
# shutdown) ends the wait instead of leaving it asleep for ever.
_SLICE_NS = 1000000000
_MARK_SLEEP_NS = 1000000
# A wait given a cancel event (dequeue(cancel=...)) looks at it this often
# while asleep: setting a threading.Event wakes no futex.
_CANCEL_POLL_NS = 10000000
# A timeout from this many seconds on (infinity, and NaN too) waits for ever.
_TIMEOUT_FOREVER_S = 1e9
# vLLM's variable for the interval of its "No available shared memory
# broadcast block found" log line, and its default (seconds).
_WARNING_INTERVAL_ENV = "VLLM_RINGBUFFER_WARNING_INTERVAL"
_WARNING_INTERVAL_S = 60

_now = time.monotonic_ns


def _warning_interval_ns():
    """How often a long wait logs (vLLM's VLLM_RINGBUFFER_WARNING_INTERVAL,
    seconds); a value that is not a positive integer is the default."""
    raw = os.environ.get(_WARNING_INTERVAL_ENV)
    try:
        seconds = int(raw) if raw is not None else _WARNING_INTERVAL_S
    except ValueError:
        seconds = _WARNING_INTERVAL_S
    return (seconds if seconds > 0 else _WARNING_INTERVAL_S) * 1000000000


def _wait_settings():
    """(adaptive, naps, spin_max_ns) from the environment:
    SHMBROKER_QUEUE_WAIT "adaptive" (the default: naps is None, naps when
    the queue's members fit this process's CPUs), "rhythm" (naps always),
    "sleep" (adaptive, never a nap) or "short"; SHMBROKER_QUEUE_SPIN_MAX_US
    an integer of 0 to SPIN_LIMIT_US. Values it cannot use are logged and
    left at their defaults."""
    mode = os.environ.get(_WAIT_ENV, "adaptive")
    if mode not in ("adaptive", "rhythm", "sleep", "short"):
        _log.warning("%s=%r: the queue's wait is 'adaptive', 'rhythm', 'sleep' or 'short'; "
                     "using 'adaptive'.", _WAIT_ENV, mode)
        mode = "adaptive"
    raw = os.environ.get(_SPIN_MAX_ENV)
    spin_us = SPIN_MAX_DEFAULT_US
    if raw is not None:
        try:
            spin_us = int(raw)
            if not 0 <= spin_us <= SPIN_LIMIT_US:
                raise ValueError
        except ValueError:
            _log.warning("%s=%r: not an integer of 0 to %d; using %d.", _SPIN_MAX_ENV, raw,
                         SPIN_LIMIT_US, SPIN_MAX_DEFAULT_US)
            spin_us = SPIN_MAX_DEFAULT_US
    naps = None if mode == "adaptive" else mode == "rhythm"
    return mode != "short", naps, spin_us * 1000


def _usable_cpus():
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class _Waiting:
    """The waits of an _Area (mixed into it): ready checks, the announce and
    futex wait, the spin, the poll and the nap, what a reader learns of its
    messages' rhythm, and the stops and timeouts that end a wait."""

    # ---- waiting --------------------------------------------------------------

    def _writer_ready(self):
        """True when the slot of message self.head is free (every live seat
        has read the message that last used it); raises when the queue is no
        longer open."""
        if self._closing:
            raise _closed_meanwhile()
        q32, q64 = self._q32, self._q64
        state = q32[80]  # header.state
        if state != QUEUE_OPEN:
            if state == QUEUE_SHUTDOWN:
                raise _cancelled()
            if state == QUEUE_WRITER_GONE:
                raise ConnectionLost("EPIPE", "This queue's writer was removed (its "
                                     "connection closed).")
            raise _corrupt("its state is %d, which no version writes" % state)
        self._writer_still()
        n = self.head
        oldest = n - self.slots
        if oldest >= self._clear:
            # Every live seat had read up to _clear at the last look: look
            # again only once the slot needed is past it. A seat taken since
            # starts at head, past any slot this writer reuses.
            low = n
            for s in range(self.seats):
                at = 1024 + 16 * s  # the seat, in 32-bit words
                if q32[at + 2] == SEAT_LIVE:
                    seen = q64[at >> 1]
                    if seen <= oldest:
                        self.blocker = s
                        return False
                    if seen < low:
                        low = seen
            self._clear = low
        # Acquire (the seats' next): every reader's release of next came
        # after its last read of the slot, so the overwrite comes after.
        if self._acquire is not None:
            self._acquire()
        return True

    def _writer_still(self):
        """Raises unless this handle still holds the writer role (its epoch
        is the area's): its connection closed and another writer took it."""
        now = self._q64[_H["writer_epoch"] // 8]
        if now != self.epoch:
            raise ConnectionLost("ENOTCONN", "This handle is no longer the queue's writer "
                                 "(writer %d; this one was %d): its connection closed and "
                                 "another writer took the queue. Open it again to write."
                                 % (now, self.epoch))

    def _reader_ready(self):
        """True when message seat.next is published. The state is read before
        head, so that what a writer published before it went is drained
        first."""
        if self._closing:
            raise _closed_meanwhile()
        q32, q64 = self._q32, self._q64
        state = q32[80]
        if state != QUEUE_OPEN:
            if state == QUEUE_SHUTDOWN:
                raise _cancelled()
            if state != QUEUE_WRITER_GONE:
                raise _corrupt("its state is %d, which no version writes" % state)
        if q32[self._i_sstate] != SEAT_LIVE or q64[self._i_epoch] != self.epoch:
            raise ConnectionLost("ENOTCONN", "Reader seat %d of this queue is no longer this "
                                 "process's: it was dropped or taken again." % self.seat)
        ahead = q64[16] - q64[self._i_next]  # header.head - seat.next
        if ahead > 0:
            self._ahead = ahead  # messages published for this seat (_wait)
            # Acquire (head): the slot is read after the writer filled it.
            if self._acquire is not None:
                self._acquire()
            return True
        if state == QUEUE_WRITER_GONE:
            raise EndOfQueue("EPIPE", "End of queue: its writer is gone and every message it "
                             "published has been read.")
        return False

    def _announce(self, writer, on, mark=False):
        """Say that this side is about to sleep, or no longer is (_futex's
        read-modify-writes are full fences, as queue.c's seq_cst fence)."""
        if writer:
            if on:
                # Before the flag, as queue.c: with the mark, sleep until the
                # slowest reader frees half the ring (the reader reaching
                # wake_at wakes); without it (0), any reader's finish wakes.
                n, slots = self.head, self.slots
                self._q64[_H["wake_at"] // 8] = (n - slots + 1 + (slots - 1) // 2
                                                 if mark and n >= slots else 0)
            _futex.exchange32(self._ww_addr, 1 if on else 0)
        elif on:
            _futex.fetch_add32(self._rw_addr, 1)
            _futex.exchange32(self._waiting_addr, 1)
        elif _futex.exchange32(self._waiting_addr, 0) != 0:
            # Whoever clears the flag takes the reader off the count: this
            # reader, or the daemon dropping or taking its seat meanwhile.
            _futex.fetch_add32(self._rw_addr, _MINUS_ONE)

    def _wait(self, writer, timeout, cancel=None, warn=False):
        """Until ready (returns) or an error (raises), as queue.c's wait_for:
        a spin of this side's adaptive budget, then futex waits. No lost
        wake-up: this side announces, reads the word, re-checks and sleeps
        only while the word still holds what it read; a waker changes the
        condition, bumps the word, then reads the announcement.

        Only a wait that is not ready at once looks further, as vLLM's: at
        this member's stop (reads_stopped, a reader's) and at cancel (an
        object with is_set(), looked at every _CANCEL_POLL_NS while asleep),
        either of which ends it with Cancelled; warn: log every
        VLLM_RINGBUFFER_WARNING_INTERVAL seconds of waiting, as vLLM does
        unless told the wait is indefinite."""
        ready = self._writer_ready if writer else self._reader_ready
        if ready():
            if not writer:
                self._ready_at_once()
            return
        if timeout is not None and not timeout < _TIMEOUT_FOREVER_S:
            timeout = None  # infinity, or NaN, which no elapsed time exceeds (vLLM's test)
        if timeout is not None and timeout <= 0:
            self._timed_out(writer, timeout)
        self._check_stop(writer, cancel)
        start = self._empty_at = _now()
        deadline = None if timeout is None else start + int(timeout * 1e9)
        poll = False
        if writer:
            budget = self._spin_w
            limit = self.spin_ns or budget
            # Held back by its readers, the adaptive writer polls as a
            # reader behind does: within spin_max_ns of its CPU, yielding
            # to the readers it waits for (without a budget, the spin).
            poll = self.adaptive and not self.spin_ns and self.spin_max_ns > 0
        elif self.spin_ns:
            budget = self._spin_r
            limit = self.spin_ns
        elif self.adaptive:
            budget = 0
            if self._poll_left:
                self._poll_left -= 1
                if self._poll(ready, start, self.spin_max_ns, deadline, False, cancel):
                    self._polled(True)
                    return
                self._polled(False)
                self._poll_left = 0  # the budget went by: the writer paused
                limit = 0
            else:
                if self._polls_off:
                    self._polls_off -= 1
                limit = self._reader_plan(start, deadline, cancel)
            if limit < 0:
                return  # the message came during the nap
            start = _now()
        else:
            budget = self._spin_r
            limit = budget
        if poll:
            spun = self._poll(ready, start, self.spin_max_ns, deadline, True, cancel)
        else:
            spun = limit and self._spin(ready, start, limit, deadline, writer, cancel)
        if spun:
            if writer:
                self._spin_w = min(budget * 2, SPIN_MAX_NS)
            elif budget:
                self._spin_r = min(budget * 2, SPIN_MAX_NS)
            return
        if writer:
            self._spin_w = max(budget // 2, SPIN_MIN_NS)
            word, addr = _H["free_word"] // 4, self._free_word_addr
        else:
            if budget:
                self._spin_r = max(budget // 2, SPIN_MIN_NS)
            word, addr = _H["head_word"] // 4, self._head_word_addr
        q32 = self._q32
        looked = _now()
        mark = writer
        nap = _SLICE_NS if cancel is None else _CANCEL_POLL_NS
        warn_every = _warning_interval_ns() if warn else 0
        warn_at = start + warn_every
        while True:
            # The writer's sleeps wait for its mark, each at most
            # _MARK_SLEEP_NS (queue.c's MARK_SLEEP_NS), until one lasts that
            # long: a slowest reader that frees a slot and then stops
            # reading must not hold it.
            self._announce(writer, True, mark)
            try:
                val = q32[word]
                ok = ready()
                if not ok:
                    self._check_stop(writer, cancel)
                now = _now()
                if not ok:
                    self._empty_at = now
                woken = False
                if not ok and (deadline is None or now < deadline):
                    until = now + (_MARK_SLEEP_NS if mark else nap)
                    self.sleeps += 1
                    _futex.futex_wait(addr, val, until if deadline is None
                                      else min(deadline, until))
                    woken = _now() < until
            finally:
                self._announce(writer, False)
                # A writer woken before its mark sleep's end (by a reader
                # that reached the mark ahead of the slowest) sleeps to its
                # mark again, so that the others' reads do not each wake
                # it; one that slept it out sleeps until any read.
                mark = mark and woken
            if ok:
                return
            now = _now()
            if deadline is not None and now >= deadline:
                # What the last sleep may have missed at its very end.
                if ready():
                    return
                # A wait that ends empty also says whether the daemon went
                # (short timeouts in a loop would never see it otherwise).
                if self.check_daemon is not None:
                    self.check_daemon()
                self._timed_out(writer, timeout)
            if self.check_daemon is not None and now - looked >= _SLICE_NS:
                looked = now
                if not ready():
                    self.check_daemon()
            if warn_every and now >= warn_at:
                self._log_long_wait(writer, (now - start) // 1000000000)
                warn_at += warn_every

    def _ready_at_once(self):
        """A reader's wait found its message there at its first look. Behind
        the writer, back to back: more than this message is published
        already (one alone is also a paced reader's that woke late), and
        messages have been coming within the spin bound of each other on
        average (a paced reader that fell behind, on a machine whose other
        work holds the CPUs, would only yield its CPU to that work and fall
        further behind): its next waits poll."""
        if (not self._polls_off and self._ahead >= _POLL_AHEAD
                and 0 < self._gap <= self.spin_max_ns):
            self._poll_left = self._poll_waits

    def _spin(self, ready, start, limit, deadline, writer, cancel):
        """Look until ready() (True) or limit ns from start have passed, or
        the deadline (False). After the first few microseconds every look
        yields the CPU (os.sched_yield), so that on a host with more members
        than CPUs the side being waited for still runs."""
        i = 0
        yield_at = start + _SPIN_PAUSE_NS
        end = start + limit
        if deadline is not None and deadline < end:
            end = deadline
        while True:
            if ready():
                return True
            i += 1
            if i & 3 == 0:
                now = _now()
                if now >= end:
                    return False
                if now >= yield_at:
                    _sched_yield()
                if i & 1023 == 0:  # a set_spin of up to 100 ms
                    self._check_stop(writer, cancel)

    def _poll(self, ready, start, budget, deadline, writer, cancel):
        """Look, yield the CPU, look again, until ready() (True) or this
        thread has spent budget ns of CPU on it, or ten times that of wall
        time, or the deadline passed (False): the wait of a reader whose
        messages have been coming back to back, and the writer's spin. Its
        CPU is read only when the wall time says the budget may be spent: a
        yield that let other processes run cost this one next to nothing."""
        self.polls += 1
        cpu0 = _thread_time()
        cap = start + budget * _POLL_WALL_PARTS
        if deadline is not None and deadline < cap:
            cap = deadline
        end = min(start + budget, cap)
        i = 0
        while True:
            if ready():
                return True
            i += 1
            if i & 1023 == 0:
                self._check_stop(writer, cancel)
            now = _now()
            if now >= end:
                left = budget - (_thread_time() - cpu0)
                if left <= 0 or now >= cap:
                    return ready()
                end = min(now + left, cap)
            self.yields += 1
            _sched_yield()

    def _polled(self, got):
        """Count a reader's poll that got its message (got) or ran out. Polls
        are judged by windows of _POLL_WINDOW: when most of a window's ran
        out (other processes hold the CPUs for longer than the budget's
        wall time, or the writer pauses often), polling costs more than the
        futex wake it saves, and the next _POLLS_OFF_FOR waits do not poll."""
        self._poll_tries += 1
        if not got:
            self._poll_misses += 1
        if self._poll_tries == _POLL_WINDOW:
            if self._poll_misses * 2 > _POLL_WINDOW:
                self._polls_off = _POLLS_OFF_FOR
                self._poll_left = 0
            self._poll_tries = self._poll_misses = 0

    def _reader_plan(self, now, deadline, cancel):
        """The adaptive wait of a reader whose message is not there yet
        (PROTOCOL.md section 9, "Waiting"): how long to spin (ns), through
        the gap when messages have been coming within the spin bound, else
        briefly; where naps are allowed (_naps_allowed) and the messages
        come in a rhythm of longer gaps, the rhythm's wait (_rhythm_wait):
        -1 when it got the message, 0 to sleep until woken. gap and dev are
        the mean time between this reader's messages and its mean
        deviation, kept by seen()."""
        gap, dev = self._gap, self._dev
        if gap == 0:
            return min(SPIN_START_NS, self.spin_max_ns)
        since = now - self._seen
        # Messages have been coming within the spin bound: spin through
        # the rest of twice the usual gap (a CPU otherwise idle).
        span = 2 * gap + 4 * dev
        if span <= self.spin_max_ns:
            return max(span - since, _SPIN_PAUSE_NS)
        if self.spin_max_ns and self._naps_allowed():
            plan = self._rhythm.plan(now)
            if plan is not None:
                return self._rhythm_wait(now, plan, deadline, cancel)
        return _SPIN_PAUSE_NS

    def _rhythm_wait(self, now, plan, deadline, cancel):
        """Messages come in a rhythm (_queue_rhythm): sleep on head_word
        until plan's wake (ahead of the next message by the lead and the
        timer's own lateness, both learnt), then poll, yielding the CPU
        between looks, until plan's end or the wait's CPU budget (the
        smaller of the rhythm's and spin_max_ns) from the wake on. A
        message that comes during the nap wakes it as it would a sleep: no
        later than without it. Returns -1 with the message there, 0 to
        sleep on the futex until woken (the rhythm broke for this one)."""
        rhythm = self._rhythm
        wake, until = plan
        if cancel is not None and wake - now > _CANCEL_POLL_NS:
            # A nap does not look at cancel: no longer than a sleep would.
            return _SPIN_PAUSE_NS
        if deadline is not None:
            wake, until = min(wake, deadline), min(until, deadline)
        cpu0 = _thread_time()
        # However short, the nap: a timer's lateness is learnt and asked
        # for ahead, and polling instead would spend as much CPU as time.
        if wake > now:
            self.naps += 1
            got = self._nap(wake, cancel)
            now = _now()
            if now >= wake:
                rhythm.overshoot(now - wake)
            if got:
                rhythm.outcome(LATE, _thread_time() - cpu0)
                return -1
            self._empty_at = now
        what = self._rhythm_poll(until, min(self.spin_max_ns, rhythm.budget()), cancel)
        rhythm.outcome(what, _thread_time() - cpu0)
        return -1 if what in (EARLY, LATE) else 0

    def _rhythm_poll(self, until, budget, cancel):
        """Look, yield the CPU, look again, until the message is there (EARLY,
        or LATE when the first look found it), until (MISSED) or this
        thread has spent budget ns of CPU on the poll (OVER)."""
        self.rhythm_polls += 1
        cpu0 = _thread_time()
        i = 0
        while True:
            if self._reader_ready():
                return EARLY if i else LATE
            now = self._empty_at = _now()
            if now >= until:
                return MISSED
            i += 1
            if i & 3 == 0:
                if _thread_time() - cpu0 >= budget:
                    return OVER
                if i & 1023 == 0:
                    self._check_stop(False, cancel)
            self.rhythm_yields += 1
            _sched_yield()

    def _naps_allowed(self):
        """Whether this reader may nap: as SHMBROKER_QUEUE_WAIT says, else
        while the writer and every live reader can each have one of this
        process's CPUs (a nap ends in a spin; spins of more members than
        CPUs take the CPU from the one they wait for). Seats are counted
        again every _FIT_LOOKS waits."""
        if self.naps_on is not None:
            return self.naps_on
        if self._fit_looks == 0:
            self._fit_looks = _FIT_LOOKS
            self._fit = self.live_seats() + 1 <= self._cpus
        self._fit_looks -= 1
        return self._fit

    def _nap(self, until, cancel):
        """Sleep on head_word until the writer publishes (True, the message
        ready) or until (monotonic ns; False), with the thread's timer slack
        at a microsecond for the sleep, so that it ends when asked."""
        slack = _futex.timer_slack(_NAP_SLACK_NS)
        self._announce(False, True)
        try:
            val = self._q32[48]  # head_word
            if self._reader_ready():
                return True
            self._check_stop(False, cancel)
            _futex.futex_wait(self._head_word_addr, val, until)
        finally:
            self._announce(False, False)
            _futex.timer_slack(slack)
        return self._reader_ready()

    def seen(self):
        """A message is there for this reader now: learn the gap between
        messages (and its spread), and the rhythm they come in."""
        now = _now()
        # The rhythm is learnt only where this reader's waits may nap
        # through one now (what _reader_plan asks before it plans a nap): a
        # few microseconds per message that a reader which cannot nap (naps
        # off, no spin budget, a fixed spin, or more members than CPUs)
        # would spend for nothing.
        if (self.naps_on is not False and self.adaptive and self.spin_max_ns
                and not self.spin_ns and self._naps_allowed()):
            self._rhythm.arrived(now, self._empty_at)
        elif self._rhythm.anchor:
            self._rhythm.pause()
        gap = now - self._seen
        self._seen = now
        if gap >= _GAP_MAX_NS:
            self._gap = self._dev = 0
            return
        g = self._gap
        if g == 0:
            self._gap = gap
            return
        g += (gap - g) >> 3
        self._gap = g
        self._dev += (abs(gap - g) - self._dev) >> 3

    def _check_stop(self, writer, cancel):
        """Raise Cancelled when this member stopped its reads (a reader's
        shutdown()) or cancel is set."""
        if self.reads_stopped and not writer:
            raise _stopped_here("this reader's shutdown() was called")
        if cancel is not None and cancel.is_set():
            raise _stopped_here("the cancel event given to this wait was set")

    def _log_long_wait(self, writer, seconds):
        """vLLM's periodic line of a long wait, with what it waits for."""
        if writer:
            _log.info("No available shared memory broadcast block found in %d seconds: "
                      "queue %s waits for reader seat %d to read message %d.", seconds,
                      self.name, self.blocker, self.head - self.slots)
        else:
            _log.info("No available shared memory broadcast block found in %d seconds: "
                      "reader seat %d of queue %s waits for message %d.", seconds,
                      self.seat, self.name, self._q64[self._i_next])

    def stop_reads(self):
        """This member's shutdown(): its waits for a message, now (in other
        threads) and later, end with Cancelled. Bumping the word wakes a
        wait asleep on it; other members wake, look and sleep again."""
        with self._lock:
            self.reads_stopped = True
            if self._closing or self._mm is None or self.seat is None:
                return
            _futex.fetch_add32(self._head_word_addr, 1)
            _futex.futex_wake(self._head_word_addr, _futex.INT_MAX)

    def _timed_out(self, writer, timeout):
        if writer:
            raise Timeout("ETIMEDOUT", "No free slot in %g s: reader seat %d has not read "
                          "message %d of this queue." % (timeout, self.blocker,
                                                         self.head - self.slots))
        raise Timeout("ETIMEDOUT", "No message in %g s." % timeout)
