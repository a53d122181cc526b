# SPDX-License-Identifier: Apache-2.0
"""Broadcast queues: vLLM's MessageQueue over shmbrokerd.

One writer, n reader seats, every reader reads every message in order. The
daemon makes the queue's area (a memfd of its own, proto/layout_queue.h) and
hands it to each member at queue_open; messages then go through the area
alone: the writer fills a slot in place and publishes it, readers read it
in place and mark it read, and either side that has to wait spins briefly
and then sleeps on a futex word of the area. No socket round trip per
message, except for messages larger than a slot, which go as store objects
of the pool ("q/<queue>/<seq>") referenced from the slot, as the C library
sends them, so C and Python members share a queue.

The data path is pure Python (memoryview casts over the mapping; futexes
and three atomic instructions through ctypes, see _futex.py), proto/queue.c's
protocol step for step. It runs on x86-64 and aarch64: where queue.c loads
with acquire or stores with release order, this module calls
_futex.fence_acquire after the plain load or _futex.fence_release before
the plain store; both are None on x86-64, whose ordering (TSO) already
makes every aligned load an acquire and every store a release.

Messages are pickled with protocol 5; out-of-band buffers (numpy arrays'
data, pickle.PickleBuffer) are written straight into the slot (or the
overflow object) in the frames layout (frames.py): frame 0 the pickle
stream, then each buffer, with the count and the lengths in its header.
Unpickling runs code the bytes name: share a queue only among processes that
trust each other, as with vLLM's.
"""

import contextlib
import dataclasses
import logging
import mmap
import os
import pickle
import secrets
import select
import socket
import struct
import threading
import time
from typing import List, Optional

from . import _futex
from . import client as _client
from . import frames as _frames
from .client import Client
from . import errors as _errors
from .errors import error_for as _error_for
from .errors import (Cancelled, ConnectionLost, EndOfQueue, InvalidRequest, KeyExists,
                     NotFound, ProtocolError, ShmBrokerError, Timeout, Unsupported)
from .pickling import pickle_frames, unpickle_frames

__all__ = ["MessageQueue", "Handle"]

_log = logging.getLogger(__name__)

# vLLM's default slot size (max_chunk_bytes) since it grew from 10 MiB: a
# drop-in made with vLLM's defaults has vLLM's geometry, 10 slots of 24 MiB.
DEFAULT_MAX_CHUNK_BYTES = 24 * 1024 * 1024
DEFAULT_MAX_CHUNKS = 10

# proto/layout_queue.h (tests/python/test_queues.py checks these against it).
QUEUE_MAGIC = 0x31455551424D4853  # "SHMBQUE1"
QUEUE_VERSION = 1
SEATS_MAX = 64
SLOTS_MIN, SLOTS_MAX = 2, 65536
SLOT_SIZE_MIN, SLOT_SIZE_MAX = 64, 1 << 30
NAME_MAX = 64
SLOT_HEADER = 64
SEAT_SIZE = 64
HEADER_PAGE = 4096
ALIGN = 64
# Byte offsets of struct shmb_queue_header's fields.
HEADER_OFFSETS = {
    "magic": 0, "version": 8, "seats": 12, "slots": 16, "slot_size": 24,
    "slot_stride": 32, "slots_offset": 40, "total_size": 48, "name": 56, "head": 128,
    "head_word": 192, "readers_waiting": 196, "free_word": 256, "writer_waiting": 260,
    "wake_at": 264, "state": 320, "writer_live": 324, "writer_epoch": 328,
}
SEAT_OFFSETS = {"next": 0, "state": 8, "waiting": 12, "epoch": 16}
SLOT_OFFSETS = {"seq": 0, "flags": 8, "len": 12, "aux": 16, "aux2": 24}
# struct shmb_queue_slot's fields in order (host order, as the C members write).
SLOT = struct.Struct("=QIIQQ")
_GEOMETRY = struct.Struct("=QIIQQQQQ")  # magic .. total_size

QUEUE_OPEN, QUEUE_SHUTDOWN, QUEUE_WRITER_GONE = 0, 1, 2
SEAT_FREE, SEAT_LIVE, SEAT_DEAD = 0, 1, 2
SLOT_INLINE, SLOT_OBJECT = 1, 2

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
# Naps ahead of an expected message: by default when the writer and every
# live reader can each have a CPU of this process's (side by side, 1 reader
# on 2 CPUs: half the p50 of plain sleeps at about the same CPU; with 4
# readers on 2 CPUs their spins ahead of the message crowd the CPUs, and the
# p50 was no better); =rhythm always, =sleep never.
_WAIT_ENV = "SHMBROKER_QUEUE_WAIT"
_SPIN_MAX_ENV = "SHMBROKER_QUEUE_SPIN_MAX_US"
SPIN_MAX_DEFAULT_US = 100
# Pure spin this long, then yield the CPU between looks.
_SPIN_PAUSE_NS = 3000
# A nap shorter than this is not worth the futex call: spin instead.
_NAP_MIN_NS = 20000
# The nap's timer slack: a microsecond, so that it ends when asked.
_NAP_SLACK_NS = 1000
# How far ahead of the expected message a nap ends: the first guess, the
# floor, and the spin a nap aims to leave before the message.
_LEAD_START_NS = 40000
_LEAD_MIN_NS = 8000
_LEAD_SPARE_NS = 4000
# The share of a long gap between messages a reader may spend spinning
# for the next one: 1/5, a fifth of a CPU at most.
_BUDGET_PARTS = 5
# Naps are judged by windows of this many: when most of a window's naps
# were woken by the writer (they overslept the message), the next
# _NAPS_OFF_FOR waits are plain ones.
_NAP_WINDOW = 16
_NAPS_OFF_FOR = 512
# Waits between two counts of the live seats (SHMBROKER_QUEUE_WAIT=adaptive).
_FIT_LOOKS = 64
# A gap this long is a pause, not a rhythm.
_GAP_MAX_NS = 100000000
_sched_yield = os.sched_yield

# wait_until_ready() looks at the seats this often (no futex is bumped when a
# seat is taken: it is set-up, not the data path).
_READY_POLL_S = (0.001, 0.02)
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
_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0)

_H = HEADER_OFFSETS
_now = time.monotonic_ns


def _round_up(v, to):
    return (v + to - 1) // to * to


def _slots_offset_for(seats):
    return _round_up(HEADER_PAGE + seats * SEAT_SIZE, HEADER_PAGE)


def queue_size(seats, slots, slot_size):
    """Bytes of a queue's area for this geometry (shmb_q_size), or 0 when
    the geometry is out of range."""
    if not (1 <= seats <= SEATS_MAX and SLOTS_MIN <= slots <= SLOTS_MAX
            and SLOT_SIZE_MIN <= slot_size <= SLOT_SIZE_MAX):
        return 0
    return _slots_offset_for(seats) + slots * _round_up(SLOT_HEADER + slot_size, ALIGN)


def _corrupt(why):
    return ShmBrokerError("EIO", "The queue's area is corrupt: %s." % why)


def _cancelled():
    return Cancelled("ECANCELED", "cancelled: the queue was shut down.")


def _stopped_here(why):
    return Cancelled("ECANCELED", "cancelled: %s; the queue itself goes on for its other "
                     "members." % why)


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


def _closed_meanwhile():
    return ConnectionLost("ENOTCONN", "This MessageQueue was closed (by another thread) while "
                          "this call was in it; nothing more was read or written.")


class _Area:
    """One member's view of a queue's area: the writer's side, or one reader
    seat's. The geometry is a private copy checked at attach; every index
    taken from the area afterwards is reduced by it, so a scribbled area
    gives errors, never an access outside the mapping.

    Takes the mapping (an mmap of at least size bytes) and closes it at
    close()."""

    def __init__(self, mm, size, seat=None, epoch=0):
        if not _futex.supported:
            raise Unsupported("ENOSYS", _futex.why_unsupported)
        if size < HEADER_PAGE or len(mm) < size:
            raise _corrupt("%d bytes mapped, fewer than its header page or than the %d "
                           "announced" % (len(mm), size))
        magic, version, seats, slots, slot_size, stride, offset, total = \
            _GEOMETRY.unpack_from(mm, 0)
        if magic != QUEUE_MAGIC or version != QUEUE_VERSION:
            raise ShmBrokerError("EIO", "This area is not a queue of layout version %d (magic "
                                 "%#x, version %d)." % (QUEUE_VERSION, magic, version))
        need = queue_size(seats, slots, slot_size)
        if (need == 0 or stride != _round_up(SLOT_HEADER + slot_size, ALIGN)
                or offset != _slots_offset_for(seats) or total != need):
            raise _corrupt("seats %d, slots %d of %d bytes, stride %d, slots at %d and %d "
                           "bytes do not go together" % (seats, slots, slot_size, stride,
                                                         offset, total))
        if size < need:
            raise _corrupt("it needs %d bytes; %d are mapped" % (need, size))
        if seat is not None and not 0 <= seat < seats:
            raise InvalidRequest("EINVAL", "This queue has %d reader seats; there is no seat "
                                 "%d." % (seats, seat))
        raw = bytes(mm[_H["name"]:_H["name"] + NAME_MAX])
        self.name = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        self.seats = seats
        self.slots = slots
        self.slot_size = slot_size
        self.stride = stride
        self.slots_offset = offset
        self.size = size
        self._mm = mm
        self._mv = memoryview(mm)
        self._q64 = self._mv[:offset].cast("Q")
        self._q32 = self._mv[:offset].cast("I")
        self._anchor = _futex.anchor(mm)
        base = _futex.address(self._anchor)
        self._base = base
        self._head_word_addr = base + _H["head_word"]
        self._rw_addr = base + _H["readers_waiting"]
        self._free_word_addr = base + _H["free_word"]
        self._ww_addr = base + _H["writer_waiting"]
        # This machine's fences (_futex), None where loads and stores are
        # ordered already (x86-64).
        self._acquire = _futex.fence_acquire
        self._release = _futex.fence_release
        # The writer's side.
        self.head = None      # the next message this writer publishes, once known
        self._reserved = False
        # The writer's or the seat's turn (claim/unclaim): one write, or one
        # read, at a time, from its wait for a slot or a message to the end
        # of its block. Two threads waiting at once would both be given the
        # same slot or the same message.
        self._turn = False
        self.blocker = 0
        self._clear = 0       # every live seat had read the messages before this
        self._spin_w = SPIN_START_NS
        self.spin_ns = 0      # 0: adaptive; else how long every wait spins
        # The reader's side.
        self.seat = seat
        self.epoch = epoch
        self._held = None     # the message held since dequeue, until done
        self._spin_r = SPIN_START_NS
        # The adaptive wait (_reader_plan): off with SHMBROKER_QUEUE_WAIT=short;
        # its naps: True, False, or None (while the members fit the CPUs).
        self.adaptive, self.naps_on, self.spin_max_ns = _wait_settings()
        self._cpus = _usable_cpus() if self.naps_on is None else 0
        self._fit = False     # the members fit the CPUs, at the last look
        self._fit_looks = 0   # waits left before the next look
        self._seen = 0        # when the last message was there (monotonic ns)
        self._gap = 0         # mean gap between messages (ns), 0: not known
        self._dev = 0         # its mean deviation
        self._lead = _LEAD_START_NS  # how far ahead of a message a nap ends
        self._nap_end = 0
        self._nap_tries = self._nap_misses = 0
        self._naps_off = 0    # waits left before naps are tried again
        self.naps = 0         # naps ahead of a message (tests look at these)
        self.sleeps = 0       # futex waits with no message expected
        # Set by this member's shutdown() (stop_reads): its waits for a
        # message end with Cancelled; other members' are not touched.
        self.reads_stopped = False
        # Calls in flight (enter/leave) and close(): the mapping goes when
        # the last call inside it has left, never under a thread using it.
        self._lock = threading.Lock()
        self._calls = 0
        self._closing = False
        # Raises when the member's daemon connection is gone (set by the
        # MessageQueue; None: nothing to look at, as in tests without one).
        self.check_daemon = None
        if seat is not None:
            at = HEADER_PAGE + seat * SEAT_SIZE
            self._i_next = at // 8
            self._i_epoch = (at + SEAT_OFFSETS["epoch"]) // 8
            self._i_sstate = (at + SEAT_OFFSETS["state"]) // 4
            self._next_addr = base + at
            self._waiting_addr = base + at + SEAT_OFFSETS["waiting"]

    # ---- words ---------------------------------------------------------------

    def state(self):
        return self._q32[_H["state"] // 4]

    def writer_live(self):
        return self._q32[_H["writer_live"] // 4]

    def published(self):
        """Messages published so far (header.head)."""
        return self._q64[_H["head"] // 8]

    def seat_state(self, s):
        return self._q32[(HEADER_PAGE + s * SEAT_SIZE + SEAT_OFFSETS["state"]) // 4]

    def seat_next(self, s):
        return self._q64[(HEADER_PAGE + s * SEAT_SIZE) // 8]

    def live_seats(self):
        return sum(1 for s in range(self.seats) if self.seat_state(s) == SEAT_LIVE)

    def _slot_at(self, n):
        return self.slots_offset + (n % self.slots) * self.stride

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
        if q64[16] > q64[self._i_next]:  # header.head
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
            return
        if timeout is not None and not timeout < _TIMEOUT_FOREVER_S:
            timeout = None  # infinity, or NaN, which no elapsed time exceeds (vLLM's test)
        if timeout is not None and timeout <= 0:
            self._timed_out(writer, timeout)
        self._check_stop(writer, cancel)
        start = _now()
        deadline = None if timeout is None else start + int(timeout * 1e9)
        if writer:
            budget = self._spin_w
            limit = self.spin_ns or budget
        elif self.spin_ns:
            budget = self._spin_r
            limit = self.spin_ns
        elif self.adaptive:
            budget = 0
            limit = self._reader_plan(start, deadline, cancel)
            if limit < 0:
                return  # the message came during the nap
            start = _now()
        else:
            budget = self._spin_r
            limit = budget
        if self._spin(ready, start, limit, deadline, writer, cancel):
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
            self._rhythm_lost()
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

    def _reader_plan(self, now, deadline, cancel):
        """The adaptive wait of a reader whose message is not there yet
        (PROTOCOL.md section 9, "Waiting"): how long to spin (ns), through
        the gap when messages have been coming within the spin bound, else
        briefly; where naps are allowed (_naps_allowed), after napping
        through most of a longer gap, or -1 when the message came during
        the nap. gap and dev are the mean time between this reader's
        messages and its mean deviation, kept by seen()."""
        gap, dev = self._gap, self._dev
        if gap == 0:
            return min(SPIN_START_NS, self.spin_max_ns)
        since = now - self._seen
        # Messages have been coming within the spin bound: spin through
        # the rest of twice the usual gap (a CPU otherwise idle).
        span = 2 * gap + 4 * dev
        if span <= self.spin_max_ns:
            return max(span - since, _SPIN_PAUSE_NS)
        if not self._naps_allowed() or self._naps_off:
            if self._naps_off:
                self._naps_off -= 1
            return _SPIN_PAUSE_NS
        # A longer gap: a fifth of it (within spin_max_ns) may be spun,
        # from a lead ahead of the next message on; sleep until then. A
        # message that comes earlier wakes the nap as it would a sleep: no
        # later than without it.
        allowance = min(gap // _BUDGET_PARTS, self.spin_max_ns)
        lead = min(self._lead, allowance - _LEAD_MIN_NS)
        if lead < _LEAD_MIN_NS:
            return _SPIN_PAUSE_NS
        start = self._seen + gap - lead
        end = start + allowance
        if deadline is not None and end > deadline:
            end = deadline
        if start - now >= _NAP_MIN_NS:
            self.naps += 1
            self._nap_tries += 1
            if self._nap_tries == _NAP_WINDOW:
                # Most naps of the window overslept: this host's timers
                # wake too late for the gap (a busy or virtual CPU). Plain
                # sleeps, woken by the writer, for a while; then try again.
                if self._nap_misses * 2 > _NAP_WINDOW:
                    self._naps_off = _NAPS_OFF_FOR
                self._nap_tries = self._nap_misses = 0
            if self._nap(start, cancel):
                # Woken by the writer: the nap was too long.
                self._nap_misses += 1
                self._lead = min(lead * 2, allowance - _LEAD_MIN_NS)
                self._nap_end = 0
                return -1
            now = self._nap_end = _now()
        return max(end - now, _SPIN_PAUSE_NS)

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
        messages (and its spread), and how early the last nap ended."""
        now = _now()
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
        nap_end = self._nap_end
        if nap_end:
            # The spin after the nap took `early` ns: aim the next nap's end
            # at _LEAD_SPARE_NS before the message.
            self._nap_end = 0
            early = now - nap_end
            lead = self._lead - ((early - _LEAD_SPARE_NS) >> 2)
            self._lead = max(_LEAD_MIN_NS, min(lead, g // _BUDGET_PARTS))

    def _rhythm_lost(self):
        """No message within the spin: the writer paused. The next gap is
        learnt afresh."""
        self._nap_end = 0

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

    # ---- the writer ---------------------------------------------------------

    def reserve(self, timeout, warn=True):
        """Wait until the next slot is free; returns (its payload, a writable
        memoryview of slot_size bytes, and the (flags, seq) it held)."""
        if self.head is None:
            self.head = self.published()
        self._wait(True, timeout, warn=warn)
        self._reserved = True
        off = self._slot_at(self.head)
        seq, flags = SLOT.unpack_from(self._mv, off)[:2]
        return self._mv[off + SLOT_HEADER:off + SLOT_HEADER + self.slot_size], flags, seq

    def forget_slot(self):
        """Mark the reserved slot as holding nothing (flags 0): what it held
        was handled."""
        SLOT.pack_into(self._mv, self._slot_at(self.head), self.head - self.slots, 0, 0, 0, 0)

    def publish(self, flags, length, aux=0):
        """Publish the reserved slot's first length bytes as the next message."""
        if not self._reserved:
            raise InvalidRequest("EINVAL", "No slot is reserved.")
        try:
            self._writer_still()  # again: the role may have gone meanwhile
        except ConnectionLost:
            self._reserved = False
            raise
        if length > self.slot_size:
            raise ProtocolError("EMSGSIZE", "A message of %d bytes does not fit this queue's "
                                "slots of %d bytes." % (length, self.slot_size))
        n = self.head
        SLOT.pack_into(self._mv, self._slot_at(n), n, flags, length, aux, 0)
        self._reserved = False
        self.head = n + 1
        # head is the store that publishes the slot (with release order:
        # the fence before it, or x86-64's own); head_word, the futex word,
        # is bumped after it by a read-modify-write, which also fences
        # before readers_waiting is read.
        if self._release is not None:
            self._release()
        self._q64[16] = n + 1
        _futex.fetch_add32(self._head_word_addr, 1)
        if self._q32[49]:  # readers_waiting
            _futex.futex_wake(self._head_word_addr, _futex.INT_MAX)

    # ---- a reader -------------------------------------------------------------

    def dequeue(self, timeout, cancel=None, warn=False):
        """The next message at this seat, in place: (flags, payload view,
        aux), valid until done() or the next dequeue."""
        self.done()
        self._wait(False, timeout, cancel, warn)
        self.seen()
        n = self._q64[self._i_next]
        off = self._slot_at(n)
        seq, flags, length, aux, _ = SLOT.unpack_from(self._mv, off)
        if seq != n or length > self.slot_size or flags not in (SLOT_INLINE, SLOT_OBJECT):
            raise _corrupt("slot %d holds message %d (flags %d, %d bytes) where message %d "
                           "was published" % (n % self.slots, seq, flags, length, n))
        self._held = n
        return flags, self._mv[off + SLOT_HEADER:off + SLOT_HEADER + length], aux

    def keep(self):
        """Give the message held back without reading it: the seat stays
        on it, and the next dequeue returns it again."""
        self._held = None

    def settle(self, keep):
        """keep() the message held when keep is true (its reader did not
        get through it), else done()."""
        if keep:
            self.keep()
        else:
            self.done()

    def done(self):
        """Finished with the message held: the writer may reuse its slot.
        Only from the message held (a compare-and-swap): a seat the daemon
        gave to another reader meanwhile starts past it and is left alone."""
        held = self._held
        if held is None:
            return
        self._held = None
        # The compare-and-swap is a full fence: either the writer, announcing
        # its sleep, sees this next, or this reads its announcement.
        if _futex.cas64(self._next_addr, held, held + 1) != held:
            return
        if self._q32[65]:  # writer_waiting: bump its word, wake it at its mark
            _futex.fetch_add32(self._free_word_addr, 1)
            at = self._q64[33]  # wake_at
            if at == 0 or at == held + 1:
                _futex.futex_wake(self._free_word_addr, 1)

    def claim(self, busy):
        """Take this member's turn to write or read (see _turn); raises
        InvalidRequest EBUSY, with the message busy, while another call,
        of this thread or another, has it."""
        with self._lock:
            if self._turn:
                raise InvalidRequest("EBUSY", busy)
            self._turn = True

    def unclaim(self):
        """Give the turn claim() took back."""
        self._turn = False

    def begin(self, busy):
        """enter() and claim() under one lock: a call that uses the mapping
        and takes this member's turn; end() ends both."""
        with self._lock:
            if self._closing:
                raise ConnectionLost("ENOTCONN", "This MessageQueue is closed.")
            if self._turn:
                raise InvalidRequest("EBUSY", busy)
            self._turn = True
            self._calls += 1

    def end(self):
        """unclaim() and leave() under one lock."""
        with self._lock:
            self._turn = False
            self._calls -= 1
            last = self._closing and self._calls == 0
        if last:
            self._unmap()

    def enter(self):
        """Start a call that uses the mapping; leave() ends it. Raises
        ConnectionLost once close() was called."""
        with self._lock:
            if self._closing:
                raise ConnectionLost("ENOTCONN", "This MessageQueue is closed.")
            self._calls += 1

    def leave(self):
        """End a call that enter() started; the last one out after close()
        unmaps."""
        with self._lock:
            self._calls -= 1
            last = self._closing and self._calls == 0
        if last:
            self._unmap()

    def close(self):
        """No call may use the area any more: unmapped now, or, while calls
        are in it (other threads), woken and unmapped by the last to leave.
        Waking bumps both futex words: a waiter that looked before the flag
        was set then finds its word changed and does not sleep (members of
        other processes wake, look and sleep again)."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._calls:
                # Under the lock: the mapping stays until the calls leave.
                _futex.fetch_add32(self._head_word_addr, 1)
                _futex.fetch_add32(self._free_word_addr, 1)
                _futex.futex_wake(self._head_word_addr, _futex.INT_MAX)
                _futex.futex_wake(self._free_word_addr, _futex.INT_MAX)
                return
        self._unmap()

    def _unmap(self):
        """Unmap the area (nothing of it may be used afterwards)."""
        if self._mm is None:
            return
        for v in (self._q64, self._q32, self._mv):
            v.release()
        self._anchor = None
        try:
            self._mm.close()
        except BufferError:
            pass  # a view still exported: the mapping goes with it
        self._mm = None


# The frames header of a message of one frame (no out-of-band buffer: most
# messages): magic, count 1, flags 0, the length; the frame at byte 64.
_ONE_FRAME = struct.Struct("<QIIQ")
_ONE_FRAME_AT = 64
_ONE_FRAME_PAD = bytes(_ONE_FRAME_AT - 24)
# And of two (a buffer sent out of band, and its small stream: the frame 0
# at byte 64, the buffer at the next multiple of 64 after it).
_TWO_FRAMES = struct.Struct("<QIIQQ")
_TWO_FRAMES_PAD = bytes(_ONE_FRAME_AT - 32)
_ZEROS_64 = bytes(64)
_SECOND_LENGTH = struct.Struct("<Q")


# ---- messages that are buffers ------------------------------------------------
#
# bytes, bytearray, memoryview and CPU torch tensors sent as a message of
# their own travel out of band, as numpy arrays do with pickle's protocol 5:
# frame 0 a small pickle stream that rebuilds the object from frame 1, and
# frame 1 the object's bytes, written straight into the slot (or overflow
# object) with no pickled copy. Any reader unpickles such a message as any
# other (PROTOCOL.md section 9, "Messages"); this module's readers go
# straight to the result for bytes and bytearray, whose stream is always
# the same. Smaller bytes and bytearray are pickled in the stream: for a
# few hundred bytes that is cheaper than a second frame.
_OOB_MIN = 1024


def _rebuild_bytes(buf):
    """bytes from an out-of-band buffer (unpickling)."""
    return bytes(buf)


def _rebuild_bytearray(buf):
    """bytearray from an out-of-band buffer: the buffer itself when the
    unpickler was given a copy already (unpickle_frames' bytearray)."""
    return buf if type(buf) is bytearray else bytearray(buf)


# A shape from a message has at most this many dimensions (memoryview's own
# limit), each a non-negative int below 2**63 (what a C size holds).
_NDIM_MAX = 64


def _shape_of(shape, what, nbytes):
    """shape, from a message's stream, as a tuple of ints, or an EIO naming
    it: anything but a tuple or list of at most _NDIM_MAX non-negative ints
    below 2**63 is a stream no writer of this module makes (a scribbled or
    hostile one), which must not reach cast() or torch as it is."""
    if type(shape) not in (tuple, list) or len(shape) > _NDIM_MAX or \
            not all(type(d) is int and 0 <= d < (1 << 63) for d in shape):
        raise _corrupt("a %s message of %d bytes has shape %.200r, which is not a tuple of at "
                       "most %d non-negative integers" % (what, nbytes, shape, _NDIM_MAX))
    return tuple(shape)


def _rebuild_memoryview(buf, fmt, shape):
    """A memoryview of format fmt and shape over a copy of buf's bytes."""
    shape = _shape_of(shape, "memoryview", len(buf))
    own = buf if type(buf) is bytearray else bytearray(buf)
    view = memoryview(own)
    if fmt == "B" and len(shape) == 1 and shape[0] == len(own):
        return view
    try:
        return view.cast(fmt, shape)
    except (TypeError, ValueError) as e:
        raise _corrupt("a memoryview message of format %.200r and shape %r does not fit its %d "
                       "bytes (%s)" % (fmt, shape, len(own), e)) from None


def _rebuild_tensor(buf, dtype, shape):
    """A CPU torch tensor of dtype (torch's attribute name) and shape over a
    copy of buf's bytes; Unsupported when torch cannot be imported here."""
    try:
        import torch
    except ImportError:
        raise Unsupported("ENOSYS", "This message is a torch tensor (%.200s, shape %.200r), "
                          "and torch cannot be imported in this process: install torch here, "
                          "or send numpy arrays (tensor.numpy()), which need only numpy."
                          % (dtype, shape)) from None
    shape = _shape_of(shape, "tensor", len(buf))
    kind = getattr(torch, dtype, None) if type(dtype) is str else None
    if not isinstance(kind, torch.dtype):
        raise _corrupt("a tensor message names dtype %.200r, which this torch does not have"
                       % (dtype,))
    if len(buf) == 0:
        # No bytes: a shape of no elements, or the message would be a
        # tensor of memory that nobody sent (as large as the shape says).
        if _elements(shape) != 0:
            raise _corrupt("a tensor message of no bytes has shape %r, of %s elements"
                           % (shape, _elements(shape)))
        try:
            return torch.empty(shape, dtype=kind)
        except (RuntimeError, TypeError, ValueError) as e:
            raise _corrupt("a tensor message of no bytes has shape %r (%s)" % (shape, e)) \
                from None
    own = buf if type(buf) is bytearray else bytearray(buf)
    try:
        return torch.frombuffer(own, dtype=torch.uint8).view(kind).reshape(shape)
    except (RuntimeError, TypeError, ValueError) as e:
        raise _corrupt("a tensor message of dtype %s and shape %r does not fit its %d bytes "
                       "(%s)" % (dtype, shape, len(own), e)) from None


def _elements(shape):
    """The number of elements of shape (a checked tuple of ints)."""
    n = 1
    for d in shape:
        n *= d
    return n


class _OutOfBand:
    """Pickles as rebuild(the buffer, *args), the buffer out of band."""

    __slots__ = ("rebuild", "buf", "args")

    def __init__(self, rebuild, buf, args=()):
        self.rebuild, self.buf, self.args = rebuild, buf, args

    def __reduce_ex__(self, protocol):
        return self.rebuild, (pickle.PickleBuffer(self.buf),) + self.args


def _oob_frames(rebuild, buf, args=()):
    """[the pickle stream, buf's bytes] of a message rebuilt by rebuild."""
    oob = []
    stream = pickle.dumps(_OutOfBand(rebuild, buf, args), protocol=5,
                          buffer_callback=oob.append)
    return [memoryview(stream), oob[0].raw()]


# The streams of bytes and bytearray messages depend on the type alone.
_BYTES_STREAM = bytes(_oob_frames(_rebuild_bytes, b"")[0])
_BYTEARRAY_STREAM = bytes(_oob_frames(_rebuild_bytearray, bytearray())[0])
_BYTES_LEN, _BYTEARRAY_LEN = len(_BYTES_STREAM), len(_BYTEARRAY_STREAM)
_STREAMS = {bytes: memoryview(_BYTES_STREAM), bytearray: memoryview(_BYTEARRAY_STREAM)}


def _message_frames(obj):
    """The frames of message obj (frames.py's layout): out of band for the
    buffers above, else pickle_frames'."""
    kind = type(obj)
    if kind is bytes or kind is bytearray:
        if len(obj) >= _OOB_MIN:
            return [_STREAMS[kind], memoryview(obj)]
    elif kind is memoryview:
        if obj.c_contiguous:
            try:
                flat = obj.cast("B")
                if obj.format != "B" or obj.ndim != 1:
                    flat.cast(obj.format, obj.shape)  # what the reader will do
            except (TypeError, ValueError):
                flat = None  # a format cast() does not take: its bytes, as format B
            if flat is not None:
                return _oob_frames(_rebuild_memoryview, flat, (obj.format, obj.shape))
        raw = obj.tobytes()
        return _oob_frames(_rebuild_memoryview, raw, ("B", (len(raw),)))
    elif kind.__name__ == "Tensor" and kind.__module__ == "torch":
        frames = _tensor_frames(obj)
        if frames is not None:
            return frames
    return pickle_frames(obj)


def _tensor_frames(t):
    """A dense CPU tensor's frames, or None for any other (pickled as torch
    pickles it)."""
    try:
        import torch
        if (t.device.type != "cpu" or t.layout != torch.strided or t.requires_grad
                or t.is_quantized or t.is_conj() or t.is_neg()):
            return None
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    except (ImportError, RuntimeError, TypeError, AttributeError):
        return None  # no numpy, or a tensor numpy cannot view
    dtype = str(t.dtype).rpartition(".")[2]
    return _oob_frames(_rebuild_tensor, raw, (dtype, tuple(t.shape)))


def _decode(views):
    """The message in views (frames as _read_message gives them): bytes
    and bytearray straight from their frame, anything else unpickled with
    its out-of-band buffers copied (the object owns its memory)."""
    if len(views) == 2:
        head = views[0]
        if head.nbytes == _BYTES_LEN and head == _BYTES_STREAM:
            return bytes(views[1])
        if head.nbytes == _BYTEARRAY_LEN and head == _BYTEARRAY_STREAM:
            return bytearray(views[1])
    return unpickle_frames(views, copy=True)


def _message_size(bufs):
    """Bytes of the frames payload of bufs."""
    if len(bufs) == 1:
        return _ONE_FRAME_AT + bufs[0].nbytes
    if len(bufs) == 2:
        return ((_ONE_FRAME_AT + bufs[0].nbytes + 63) & ~63) + bufs[1].nbytes
    return _frames.layout([b.nbytes for b in bufs])[2]


def _write_message(view, bufs):
    """Write bufs into view (exactly _message_size bytes) in the frames
    layout; frames.write's result, without its generality for one frame or
    two."""
    if len(bufs) == 2:
        n0, n1 = bufs[0].nbytes, bufs[1].nbytes
        end0 = _ONE_FRAME_AT + n0
        at1 = (end0 + 63) & ~63
        _TWO_FRAMES.pack_into(view, 0, _frames.MAGIC, 2, 0, n0, n1)
        view[32:_ONE_FRAME_AT] = _TWO_FRAMES_PAD
        view[_ONE_FRAME_AT:end0] = bufs[0]
        view[end0:at1] = _ZEROS_64[:at1 - end0]
        view[at1:at1 + n1] = bufs[1]
        return
    if len(bufs) != 1:
        _frames.write(view, bufs)
        return
    n = bufs[0].nbytes
    _ONE_FRAME.pack_into(view, 0, _frames.MAGIC, 1, 0, n)
    view[24:_ONE_FRAME_AT] = _ONE_FRAME_PAD
    view[_ONE_FRAME_AT:_ONE_FRAME_AT + n] = bufs[0]


def _read_message(view):
    """The frames of a message (views into view), as frames.parse."""
    size = view.nbytes
    if size >= _ONE_FRAME_AT:
        magic, count, flags, n0 = _ONE_FRAME.unpack_from(view, 0)
        if magic == _frames.MAGIC and flags == 0:
            if count == 1:
                if n0 == size - _ONE_FRAME_AT:
                    return [view[_ONE_FRAME_AT:].toreadonly()]
            elif count == 2:
                n1 = _SECOND_LENGTH.unpack_from(view, 24)[0]
                end0 = _ONE_FRAME_AT + n0
                at1 = (end0 + 63) & ~63
                if at1 + n1 == size:
                    return [view[_ONE_FRAME_AT:end0].toreadonly(), view[at1:].toreadonly()]
    return _frames.parse(view)


_WRITE_BUSY = ("This writer is already writing a message (inside an acquire_write() block, "
               "or in enqueue() or acquire_write() in another thread): its slot is not "
               "published yet. Write the next message after that one, from one thread at a "
               "time.")
_READ_BUSY = ("This reader is already reading a message (inside an acquire_read() block, "
              "or in dequeue() or acquire_read() in another thread): the message it holds "
              "is not read yet. Read the next message after that one, from one thread at "
              "a time.")


def _wait_options(indefinite, cancel):
    """(cancel, indefinite) of dequeue() and acquire_read(). vLLM's
    releases differ in their parameters after timeout: (indefinite) in
    current ones, (cancel, indefinite) in some before; a positional call
    in the older order (an Event second, or a bool third) is taken so."""
    if isinstance(cancel, bool) or callable(getattr(indefinite, "is_set", None)):
        indefinite, cancel = cancel, indefinite
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise TypeError("cancel must be None or an object with is_set(), such as a "
                        "threading.Event; got %r." % (cancel,))
    return cancel, bool(indefinite)


class _WriterFailed:
    """Sent over a process group in place of a handle: the member that
    should have made the queue could not (picklable: the error's class
    name, code and message)."""

    def __init__(self, error, whole=False):
        self.kind = type(error).__name__
        self.code = getattr(error, "code", None)
        self.message = str(error)
        self.whole = whole  # the error speaks of the group: raised as it is

    def error(self, who="the writer could not make the queue"):
        text = self.message if self.whole else "%s: %s: %s" % (who, self.kind, self.message)
        kind = getattr(_errors, self.kind, None)
        if self.code and isinstance(kind, type) and issubclass(kind, ShmBrokerError):
            return kind(self.code, text)  # the same class on every member
        if self.code:
            return _error_for(self.code, text)
        return RuntimeError(text)


def _away(group, center, socket_path, role, bad=None):
    """The group ranks that do not reach the host and daemon socket of
    group rank center (a collective: every member gathers every member's
    node key and the center it names, so every member computes the same
    list); InvalidRequest when the members name different centers (each
    would wait for a queue, or readers, that never come), else bad (the
    error of a center that is not a rank of the group) when given: a
    member whose center is not valid still takes part in the collective,
    as refused alone it would leave the others waiting in it until the
    group's own timeout."""
    from . import _groups

    said = group.all_gather((_groups.node_key(socket_path),
                             center if bad is None else ("not a rank", repr(center))))
    centers = [c for _, c in said]
    if len(set(map(repr, centers))) > 1:
        raise InvalidRequest("EINVAL", "The members of this process group name different %s "
                             "ranks: group ranks %s said [%s]. Nothing was made; every member "
                             "must pass the same one." % (
                                 role, group.global_ranks,
                                 ", ".join(c[1] if isinstance(c, tuple) else repr(c)
                                           for c in centers)))
    if bad is not None:
        raise bad
    keys = [k for k, _ in said]
    return [r for r, k in enumerate(keys) if k != keys[center]]


def _check_local(group, center, socket_path, role, bad=None):
    """Raise Unsupported, on every member alike, when some member of group
    does not reach the same host and daemon socket as group rank center."""
    away = _away(group, center, socket_path, role, bad)
    if away:
        raise Unsupported("ENOSYS", "Ranks %s of this process group are not on the %s's host "
                          "or do not reach its shmbrokerd (%s): this queue has its %s on "
                          "one host. Nothing was made. Give every member the same socket "
                          "(SHMBROKER_SOCKET)." % ([group.global_ranks[r] for r in away],
                                                   role, _client.default_socket_path(
                                                       socket_path), role))


class _GroupAway(Unsupported):
    """Some members of a process group cannot be reached (raised as
    Unsupported, its message the same on every member)."""


def _relay_attached(socket_path):
    """Whether a shmbroker-relay answers next to the daemon at socket_path."""
    from . import _fetch

    try:
        _fetch.ask(_fetch.relay_socket_path(_client.default_socket_path(socket_path)),
                   {"op": "status"}, timeout=10)
        return True
    except ShmBrokerError:
        return False


def _no_relay(group, away, socket_path):
    """Unsupported for a writer whose daemon has no relay attached, while
    the group has members elsewhere (away: their group ranks)."""
    return _GroupAway("ENOSYS", "Ranks %s of this process group are not on the writer's host "
                       "or do not reach its shmbrokerd (%s), and no shmbroker-relay is "
                       "attached to that daemon to carry the queue to them. Nothing was "
                       "made. Run shmbroker-relay next to the daemon on every host, each "
                       "with the others as peers (docs/multi-host.md), or give every member "
                       "the same socket (SHMBROKER_SOCKET)."
                       % ([group.global_ranks[r] for r in away],
                          _client.default_socket_path(socket_path)))


def _check_name(name):
    if (not isinstance(name, str) or not 1 <= len(name) <= 32
            or not all(c.isascii() and (c.isalnum() or c in "_-") for c in name)):
        raise InvalidRequest("EINVAL", "Queue name %r: names are 1 to 32 of A-Z, a-z, 0-9, "
                             "'_' and '-'." % (name,))
    return name


def _map_queue(reply, fds):
    """Map the queue descriptor queue_open passed; returns (mmap, size). The
    descriptors are closed here."""
    try:
        size = reply.get("size")
        if type(size) is not int or size < HEADER_PAGE:
            raise ProtocolError("EPROTO", "shmbrokerd's queue_open reply lacks a valid "
                                "\"size\".")
        if not fds:
            raise ProtocolError("EPROTO", "shmbrokerd's queue_open reply carried no queue "
                                "descriptor.")
        st = os.fstat(fds[0])
        if st.st_size < size:
            raise ProtocolError("EPROTO", "The queue descriptor has %d bytes; queue_open "
                                "said %d." % (st.st_size, size))
        return mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE), size
    finally:
        for fd in fds:
            os.close(fd)


@dataclasses.dataclass
class Handle:
    """What a reader needs to join a queue: picklable, from
    MessageQueue.export_handle(). ``local_reader_ranks`` as vLLM's Handle;
    ``buffer_handle`` is (n_reader, max_chunk_bytes, max_chunks, queue name)
    as vLLM's ring's; the daemon and pool are named by socket_path and pool."""

    local_reader_ranks: List[int] = dataclasses.field(default_factory=list)
    buffer_handle: Optional[tuple] = None
    name: str = ""
    socket_path: str = ""
    pool: Optional[str] = None


class MessageQueue:
    """vLLM's broadcast MessageQueue (shm_broadcast.py) over shmbrokerd.

    The writer makes it:

        mq = MessageQueue(n_reader=4, n_local_reader=4)
        handle = mq.export_handle()        # send it to the readers
        mq.wait_until_ready()
        mq.enqueue(obj)                    # or mq.broadcast_object(obj)

    and each reader joins with ``MessageQueue.create_from_handle(handle,
    rank)``, calls wait_until_ready() and then dequeue() (or
    broadcast_object()) once per message.

    Arguments as vLLM's: n_reader, n_local_reader (default n_reader),
    local_reader_ranks (default 0..n_local_reader-1; a rank's seat is its
    index there), max_chunk_bytes (the slot size, default vLLM's 24 MiB;
    larger messages go as store objects instead of vLLM's ZeroMQ socket)
    and max_chunks (slots, default 10). A process group's members make
    their queue with create_from_process_group() as in vLLM.
    Readers on other hosts (n_reader > n_local_reader) are served
    through shmbroker-relay on each host, the writer's host found at
    connect_ip (docs/multi-host.md). Keywords: name (the queue's, default a fresh
    "mq-<pid>-<hex>"), socket_path and pool (of the daemon to use), or
    client (a shmbroker.Client of this process to use and leave open; the
    queue's membership is its connection, so it must outlive the queue).

    The queue is created "temporary": the daemon deletes it once its writer
    and every reader have left. shutdown() is vLLM's (it stops the caller's
    own reads); shutdown_queue() stops the queue for every member.
    Differences from vLLM that code may see: a reader whose writer is gone
    gets EndOfQueue (an EOFError) once it has read everything; a dead reader
    no longer holds the writer back. Timeouts are in seconds (None: for
    ever) and raise shmbroker.Timeout, a TimeoutError; a queue shut down
    raises Cancelled, a RuntimeError("cancelled: ..."). One thread per
    MessageQueue, except shutdown(), shutdown_queue() and close(), which
    any thread may call (a call waiting in another thread then raises). A
    member whose daemon died (killed, no shutdown) raises ConnectionLost
    within about a second of waiting. A MessageQueue belongs to the process that made it: in a child made by
    fork() since, every call raises ECHILD and touches nothing (the child
    may make its own with create_from_handle).
    """

    def __init__(self, n_reader, n_local_reader=None, local_reader_ranks=None,
                 max_chunk_bytes=DEFAULT_MAX_CHUNK_BYTES, max_chunks=DEFAULT_MAX_CHUNKS,
                 connect_ip=None, *,
                 name=None, socket_path=None, pool=None, client=None):
        if n_local_reader is None:
            n_local_reader = n_reader
        if local_reader_ranks is None:
            local_reader_ranks = list(range(n_local_reader))
        elif len(local_reader_ranks) != n_local_reader:
            raise ValueError("local_reader_ranks has %d ranks for %d local readers."
                             % (len(local_reader_ranks), n_local_reader))
        # Every reader may be on another host (vLLM's writer on a node of
        # its own): then no local seat is needed.
        least = 0 if type(n_reader) is int and n_reader > n_local_reader else 1
        if not least <= n_local_reader <= SEATS_MAX:
            raise ValueError("A queue has %d to %d local readers, not %d%s."
                             % (least, SEATS_MAX, n_local_reader,
                                "" if least else " (0 only when every reader is on another "
                                "host: n_reader > n_local_reader)"))
        self._init_common()
        self.n_reader = n_reader
        self.n_local_reader = n_local_reader
        self.local_reader_ranks = list(local_reader_ranks)
        self.max_chunk_bytes = max_chunk_bytes
        self.max_chunks = max_chunks
        self.name = _check_name(name) if name is not None else \
            "mq-%d-%s" % (os.getpid(), secrets.token_hex(4))
        self._is_writer = True
        from . import _remote_queue
        self._connect(client, socket_path, pool, "mq %s writer" % self.name)
        try:
            self.client._call({"op": "queue_create", "name": self.name,
                               "seats": _remote_queue.writer_seats(n_reader, n_local_reader,
                                                                   SEATS_MAX),
                               "slots": max_chunks,
                               "slot_size": max_chunk_bytes, "temporary": True})
            self._open({"op": "queue_open", "name": self.name, "role": "writer"}, None)
        except BaseException:
            self.close()
            raise
        self.handle = Handle(local_reader_ranks=list(self.local_reader_ranks),
                             buffer_handle=(n_reader, max_chunk_bytes, max_chunks, self.name),
                             name=self.name, socket_path=self.client.socket_path,
                             pool=self.client.pool)
        if n_reader > n_local_reader:  # readers on other hosts, through the relays
            _remote_queue.export(self, connect_ip)

    def _init_common(self):
        self._forks = _client._forks[0]
        self.client = None
        self._own_client = False
        self._area = None
        self._role = None
        self.closed = False
        self.local_reader_rank = -1
        self.shutting_down = False

    def _connect(self, client, socket_path, pool, who):
        if client is not None:
            self.client = client
        else:
            self.client = Client(socket_path, name=who, pool=pool, populate=False)
            self._own_client = True

    def _open(self, req, seat):
        reply, fds = self.client._call_fds(req)
        self._role = req.get("role"), seat
        mm, size = _map_queue(reply, fds)
        epoch = reply.get("epoch")
        if type(epoch) is not int or epoch < 0:
            mm.close()
            raise ProtocolError("EPROTO", "shmbrokerd's queue_open reply lacks the role's "
                                "\"epoch\".")
        try:
            self._area = _Area(mm, size, seat=seat, epoch=epoch)
        except BaseException:
            mm.close()
            raise
        self._area.check_daemon = self._check_daemon
        return reply

    def _check_daemon(self):
        """Raise ConnectionLost when this member's daemon connection is gone
        (the daemon died or stopped): its membership went with it, and no
        one is left to wake its waits. Looks at the socket without reading
        from it (a reply another thread waits for stays where it is)."""
        if self.closed:
            raise _closed_meanwhile()
        client = self.client
        sock = client._sock if client is not None else None
        gone = sock is None
        if not gone:
            try:
                poller = select.poll()
                poller.register(sock.fileno(), select.POLLIN | _HANGUP)
                events = poller.poll(0)
                if events and events[0][1] & _HANGUP:
                    gone = True
                elif events:
                    gone = not sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
            except (OSError, ValueError):
                gone = True
        if gone:
            raise ConnectionLost("ECONNRESET", "shmbrokerd went away (the connection of queue "
                                 "'%s' closed), and this member's role went with it. Start "
                                 "the daemon if it is not running, reconnect and open the "
                                 "queue again." % self.name)

    def _here(self):
        """Raise ECHILD in a child made by fork() since this queue was
        made: its area, position and connection are the parent's."""
        if self._forks != _client._forks[0]:
            raise ShmBrokerError("ECHILD", "This MessageQueue was made by another process and "
                                 "is used in a child made by fork() since: its role belongs "
                                 "to the parent. Nothing was done; join the queue anew in the "
                                 "child (MessageQueue.create_from_handle).")

    def _enter(self):
        """The area, for one call (_Area.enter; the caller leaves it)."""
        self._here()
        area = self._area
        if area is None:
            raise ConnectionLost("ENOTCONN", "This MessageQueue is closed.")
        area.enter()
        return area

    @property
    def is_writer(self):
        return self._is_writer

    def export_handle(self):
        """The Handle readers pass to create_from_handle (picklable)."""
        return self.handle

    def set_spin(self, spin_us):
        """How long this member's waits spin before they sleep on the futex:
        0 (the default) an adaptive 1 to 50 us, which costs nothing while
        idle but pays a wake-up for a message that comes later; spin_us (up
        to 100000) spins that long, so messages that come within it are seen
        at once, as by vLLM's busy-polling readers, while a queue idle for
        longer still sleeps. Not vLLM's: an addition."""
        if type(spin_us) is not int or not 0 <= spin_us <= SPIN_LIMIT_US:
            raise InvalidRequest("EINVAL", "spin_us must be an integer from 0 to %d, not %r."
                                 % (SPIN_LIMIT_US, spin_us))
        area = self._enter()
        try:
            area.spin_ns = spin_us * 1000
        finally:
            area.leave()

    @staticmethod
    def create_from_handle(handle, rank, *, client=None):
        """Join the queue of handle as the reader of rank: its seat is rank's
        index in handle.local_reader_ranks; it reads from the next message
        published. client: a Client of this process to use (default a new
        one, closed by close())."""
        if rank not in handle.local_reader_ranks:  # a reader on another host
            from . import _remote_queue
            return _remote_queue.join(handle, rank, client)
        self = MessageQueue.__new__(MessageQueue)
        self._init_common()
        n_reader, max_chunk_bytes, max_chunks, name = handle.buffer_handle
        self.n_reader = n_reader
        self.n_local_reader = len(handle.local_reader_ranks)
        self.local_reader_ranks = list(handle.local_reader_ranks)
        self.max_chunk_bytes = max_chunk_bytes
        self.max_chunks = max_chunks
        self.name = handle.name
        self.handle = handle
        self._is_writer = False
        self.local_reader_rank = handle.local_reader_ranks.index(rank)
        self._connect(client, handle.socket_path, handle.pool,
                      "mq %s reader %s" % (self.name, rank))
        try:
            self._open({"op": "queue_open", "name": self.name, "role": "reader",
                        "seat": self.local_reader_rank}, self.local_reader_rank)
        except BaseException:
            self.close()
            raise
        return self

    @staticmethod
    def create_from_process_group(pg, max_chunk_bytes, max_chunks, writer_rank=0,
                                  external_writer_handle=None, blocking=True, *,
                                  socket_path=None, pool=None):
        """vLLM's: every member of pg (a torch.distributed ProcessGroup or
        vLLM's StatelessProcessGroup) calls it; the member of group rank
        writer_rank makes the queue, with every other member a reader,
        and sends them its handle over pg; each returns its MessageQueue,
        ready (every seat taken) once blocking. external_writer_handle:
        the writer's member joins that queue as a reader instead and hands
        it on. A collective: a member that does not call it holds the
        others.

        Members that reach the writer's shmbrokerd (the same host and
        socket; socket_path and pool as for MessageQueue) read it there;
        the others are its remote readers, served through shmbroker-relay
        (as vLLM serves them over ZeroMQ): each joins a copy of the queue
        in its own daemon (socket_path names it), which the relays keep
        fed. They find the writer's relay by the name it gives itself,
        else at the writer's connect_ip (VLLM_HOST_IP when set). When the
        writer's daemon has no relay, every member raises Unsupported
        naming the others; when any member cannot take its seat, every
        member raises its error; no member is left waiting and no queue
        is left behind."""
        from . import _groups

        group = _groups.wrap(pg)
        bad = None
        if type(writer_rank) is not int or not 0 <= writer_rank < group.world_size:
            bad = InvalidRequest("EINVAL", "writer_rank %r is not a rank of this group of %d "
                                 "(its group ranks are 0 to %d)."
                                 % (writer_rank, group.world_size, group.world_size - 1))
        away = _away(group, writer_rank, socket_path, "writer", bad)
        mq = failed = None
        try:
            if group.rank == writer_rank:
                # What failed is sent in place of the handle: the readers
                # raise it too instead of waiting for a handle that never
                # comes (a KeyboardInterrupt as well: it leaves this member
                # only once the others know).
                try:
                    if external_writer_handle is not None:
                        mq = MessageQueue.create_from_handle(external_writer_handle,
                                                             group.rank)
                    else:
                        if away and not _relay_attached(socket_path):
                            raise _no_relay(group, away, socket_path)
                        readers = [r for r in range(group.world_size) if r != writer_rank]
                        local = [r for r in readers if r not in away]
                        mq = MessageQueue(len(readers), len(local), local, max_chunk_bytes,
                                          max_chunks, os.environ.get("VLLM_HOST_IP") or None,
                                          socket_path=socket_path, pool=pool)
                except BaseException as e:
                    group.broadcast(_WriterFailed(e, whole=isinstance(e, _GroupAway)),
                                    writer_rank)
                    raise
                group.broadcast(mq.export_handle(), writer_rank)
            else:
                handle = group.broadcast(None, writer_rank)
                if isinstance(handle, _WriterFailed):
                    raise handle.error()
                try:
                    if group.rank in away:
                        from . import _remote_queue
                        mq = _remote_queue.join(handle, group.rank, socket_path=socket_path,
                                                pool=pool)
                    else:
                        # The same daemon, maybe at another path here (a
                        # bind mount, a relative path): join through ours.
                        import copy
                        handle = copy.copy(handle)
                        handle.socket_path = _client.default_socket_path(socket_path)
                        mq = MessageQueue.create_from_handle(handle, group.rank)
                except BaseException as e:
                    failed = e
            # One more round: a member that could not take its seat (a
            # remote one's relay, or the writer's, unreachable; a local
            # one's daemon gone) fails every member, or the writer would
            # wait for that seat for ever.
            every = group.all_gather(_WriterFailed(failed) if failed is not None else None)
            if failed is not None:
                raise failed
            bad = [(group.global_ranks[r], f) for r, f in enumerate(every) if f is not None]
            if bad:
                raise bad[0][1].error("rank %d of the group could not join the queue%s"
                                      % (bad[0][0], " from its host" if bad[0][0] in
                                         [group.global_ranks[r] for r in away] else ""))
            if blocking:
                mq.wait_until_ready()
        except BaseException:
            # A collective that failed (the group's timeout, a member gone)
            # or a wait interrupted: no queue is left behind for as long as
            # this process lives.
            if mq is not None:
                mq.close()
            raise
        return mq

    @staticmethod
    def create_from_process_group_single_reader(pg, max_chunk_bytes, max_chunks,
                                                reader_rank=0, blocking=False, *,
                                                socket_path=None, pool=None):
        """vLLM's: every member of pg calls it and makes a queue of its own
        with one reader seat; the member of rank reader_rank (a global rank
        for a torch group, as in vLLM) gets every member's handle, in group
        rank order, to join each with create_from_handle(handle, 0).
        Returns (this member's MessageQueue, the handles: empty except at
        the reader). blocking: wait until the reader has joined (it must
        do so from another thread or process meanwhile). Every member must
        reach the reader's shmbrokerd, as for create_from_process_group."""
        from . import _groups

        group = _groups.wrap(pg)
        bad = None
        if reader_rank not in group.global_ranks:
            bad = InvalidRequest("EINVAL", "reader_rank %r is not a rank of this group (its "
                                 "ranks are %r)." % (reader_rank, group.global_ranks))
        reader = reader_rank if bad else group.global_ranks.index(reader_rank)
        _check_local(group, reader, socket_path, "reader", bad)
        # Every member learns every other's outcome (vLLM gathers to the
        # reader only): one that failed fails them all, none is left waiting.
        mq = failed = None
        try:
            mq = MessageQueue(1, 1, [0], max_chunk_bytes, max_chunks,
                              socket_path=socket_path, pool=pool)
        except Exception as e:
            failed = e
        every = group.all_gather(_WriterFailed(failed) if failed else mq.export_handle())
        try:
            if failed is not None:
                raise failed
            bad = [(group.global_ranks[r], h) for r, h in enumerate(every)
                   if isinstance(h, _WriterFailed)]
            if bad:
                raise bad[0][1].error("rank %d of the group could not make its queue"
                                      % bad[0][0])
            if blocking:
                mq.wait_until_ready()
        except BaseException:
            if mq is not None:
                mq.close()
            raise
        return mq, (every if group.rank == reader else [])

    def __repr__(self):
        return "<shmbroker.MessageQueue %s %s%s>" % (
            self.name, "writer" if self._is_writer else "reader seat %d" % self.local_reader_rank,
            " closed" if self.closed else "")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def wait_until_ready(self, timeout=None):
        """The writer: wait until every reader seat is taken; a reader: until
        the queue has a writer (or has messages). Messages published before
        a seat is taken never reach it, which is why vLLM calls this on
        every member before the first message. Raises Timeout, Cancelled."""
        area = self._enter()
        try:
            self._wait_ready(area, timeout)
        finally:
            area.leave()

    def _wait_ready(self, area, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = _READY_POLL_S[0]
        looked = time.monotonic()
        while True:
            if area._closing:
                raise _closed_meanwhile()
            state = area.state()
            if state == QUEUE_SHUTDOWN:
                raise _cancelled()
            if self._is_writer:
                live = area.live_seats()
                if live == area.seats:
                    return
                what = "%d of %d reader seats are taken" % (live, area.seats)
            else:
                if area.writer_live() or area.published() or state != QUEUE_OPEN:
                    return
                what = "the queue has no writer"
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise Timeout("ETIMEDOUT", "Not ready in %g s: %s." % (timeout, what))
            if now - looked >= _SLICE_NS / 1e9:
                looked = now
                self._check_daemon()
            time.sleep(pause if deadline is None else
                       max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(pause * 2, _READY_POLL_S[1])

    def enqueue(self, obj, timeout=None):
        """Send obj to every reader: pickled (protocol 5, out-of-band buffers
        written in place) into the next slot, or into a store object when it
        does not fit one. Waits (timeout in seconds, None: for ever) while
        the slowest live reader has not read the message that last used the
        slot, logging every VLLM_RINGBUFFER_WARNING_INTERVAL seconds of it
        as vLLM does. Raises Timeout, Cancelled, ConnectionLost (EPIPE: this
        writer was removed), and for a message larger than a slot what
        alloc() raises (NoSpace when the pool has no room for it now)."""
        if not self._is_writer:
            self._writer_only("enqueue")
        area = self._area_for_call()
        bufs = _message_frames(obj)
        area.begin(_WRITE_BUSY)
        try:
            self._enqueue(area, bufs, timeout)
        finally:
            area.end()

    def _writer_only(self, what):
        if not self._is_writer:
            raise InvalidRequest("EINVAL", "Only the writer can %s; this is reader seat %d."
                                 % (what, self.local_reader_rank))

    def _reserve(self, area, timeout):
        """The next slot's payload (a writable view of slot_size bytes), once
        free; the caller holds the writer's turn (area.begin). The overflow
        object of the message that used it last goes now, once, whatever
        this message becomes: every live reader is done with it."""
        try:
            payload, old_flags, old_seq = area.reserve(timeout)
        except BaseException:
            area._reserved = False
            raise
        n = area.head
        if old_flags == SLOT_OBJECT and n >= area.slots and old_seq == n - area.slots:
            area.forget_slot()
            try:
                self.client.delete(self._object_key(old_seq), noreply=True)
            except BaseException:
                payload.release()
                area._reserved = False
                raise
        return payload

    def _area_for_call(self):
        """The area, once this process is the queue's and it is open."""
        self._here()
        area = self._area
        if area is None:
            raise ConnectionLost("ENOTCONN", "This MessageQueue is closed.")
        return area

    def _enqueue(self, area, bufs, timeout):
        total = _message_size(bufs)
        payload = self._reserve(area, timeout)
        try:
            n = area.head
            if total <= area.slot_size:
                _write_message(payload[:total], bufs)
                area.publish(SLOT_INLINE, total)
                return
            key = self._object_key(n)
            try:
                a = self.client.alloc(key, total, readers=area.live_seats())
            except KeyExists:
                # Left by a writer that died between committing this
                # message's object and publishing its slot: nobody can
                # have read it. Deleted, and the allocation tried once more.
                try:
                    self.client.delete(key)
                except NotFound:
                    pass
                a = self.client.alloc(key, total, readers=area.live_seats())
            try:
                _write_message(a.view, bufs)
            except BaseException:
                a.abort()
                raise
            a.commit()
            raw = key.encode()
            payload[:len(raw)] = raw
            area.publish(SLOT_OBJECT, len(raw), total)
        finally:
            payload.release()
            area._reserved = False

    @contextlib.contextmanager
    def acquire_write(self, timeout=None):
        """vLLM's: ``with mq.acquire_write(timeout) as buf:`` waits for the
        next slot as enqueue() does and gives its bytes (a writable
        memoryview of max_chunk_bytes) to fill; leaving the block publishes
        the whole slot to every reader, where acquire_read() gives the same
        bytes. A block left by an exception publishes nothing. The bytes are
        the caller's own format: dequeue() reads only what enqueue() wrote
        (the frames layout), so pair acquire_write with acquire_read. The
        view is released at the end of the block (keep nothing made from
        it: BufferError, as vLLM's)."""
        self._writer_only("acquire a slot to write")
        area = self._area_for_call()
        area.begin(_WRITE_BUSY)
        try:
            payload = self._reserve(area, timeout)
            try:
                yield payload
                area.publish(SLOT_INLINE, area.slot_size)
            finally:
                area._reserved = False
                payload.release()
        finally:
            area.end()

    def _object_key(self, seq):
        return "q/%s/%d" % (self.name, seq)

    def dequeue(self, timeout=None, indefinite=False, cancel=None):
        """The next message, unpickled (it owns its memory: nothing points
        into the queue afterwards). Waits (timeout in seconds, None: for
        ever) until the writer publishes it. As vLLM's: cancel (a
        threading.Event) ends the wait with Cancelled once set; a wait logs
        every VLLM_RINGBUFFER_WARNING_INTERVAL seconds, unless indefinite;
        after this member's shutdown(), a message already published is
        still returned, and a wait for one raises Cancelled. (Positional
        arguments in the order of vLLM releases that had (timeout, cancel,
        indefinite) are taken in that order.)
        Raises Timeout, Cancelled, EndOfQueue (the writer is gone and
        everything it sent was read), ConnectionLost (ENOTCONN: this seat
        was dropped)."""
        if indefinite is not False or cancel is not None:
            cancel, indefinite = _wait_options(indefinite, cancel)
        if self._is_writer:
            raise InvalidRequest("EINVAL", "Only readers can dequeue; this is the writer.")
        # The path of a message in its slot, as _message's with fewer steps:
        # one lock for the call and the turn, no generator.
        area = self._area_for_call()
        area.begin(_READ_BUSY)
        try:
            flags, payload, aux = area.dequeue(timeout, cancel, not indefinite)
            if flags == SLOT_INLINE:
                keep = True  # an error leaves the message for the next call
                try:
                    views = _read_message(payload)
                    try:
                        obj = _decode(views)
                    finally:
                        for v in views:
                            v.release()
                    keep = False
                    return obj
                finally:
                    payload.release()
                    area.settle(keep)
            payload.release()
            area.keep()  # an object: _message below takes it again
        finally:
            area.end()
            if self.client is not None and self.client._later:
                self._send_releases()
        with self._message(timeout, cancel, not indefinite) as (flags, held, size):
            if flags == SLOT_OBJECT:
                return self._unpickle_object(held, size)
            views = _read_message(held)
            try:
                return _decode(views)
            finally:
                for v in views:
                    v.release()

    @contextlib.contextmanager
    def acquire_read(self, timeout=None, indefinite=False, cancel=None):
        """vLLM's: ``with mq.acquire_read(timeout, indefinite) as
        buf:`` waits for the next message as dequeue() does and gives its
        bytes in place, read-only views valid inside the block: what
        acquire_write's block filled (the whole slot), or the frames of
        what enqueue() sent (larger than a slot: its object's bytes, pinned
        for the block). Leaving the block marks the message read; leaving it
        by an exception does not, as vLLM's: the next read returns it again."""
        cancel, indefinite = _wait_options(indefinite, cancel)
        if self._is_writer:
            raise InvalidRequest("EINVAL", "Only readers can acquire a message to read; this "
                                 "is the writer.")
        with self._message(timeout, cancel, not indefinite) as (flags, held, size):
            view = (held.view if flags == SLOT_OBJECT else held)[:size].toreadonly()
            try:
                yield view
            finally:
                view.release()

    @contextlib.contextmanager
    def _message(self, timeout, cancel, warn):
        """The next message at this seat, held for the block: (SLOT_INLINE,
        the slot's bytes, their length) or (SLOT_OBJECT, the pin of its
        object, the message's length in it). Leaving the block marks it read and releases the
        pin; a message whose object could not be asked for (the client busy
        in another thread), or whose block was left by an exception, stays
        at this seat for the next call."""
        area = self._enter()
        claimed = False
        try:
            area.claim(_READ_BUSY)
            claimed = True
            flags, payload, aux = area.dequeue(timeout, cancel, warn)
            keep = False
            pin = None
            try:
                if flags == SLOT_INLINE:
                    try:
                        yield flags, payload, payload.nbytes
                    except BaseException:
                        keep = True  # see below
                        raise
                    return
                try:
                    pin = self._pin_object(bytes(payload))
                except ShmBrokerError as e:
                    # Nothing was taken, so the message stays at this seat
                    # and the next call returns it.
                    keep = e.code in _client._NOT_SENT
                    raise
                # The message is the object's first aux bytes: a writer may
                # have reserved more than it published (PROTOCOL.md section 9).
                if aux > pin.size:
                    raise _corrupt("overflow object %s has %d bytes; its slot says %d"
                                   % (pin.key, pin.size, aux))
                try:
                    yield flags, pin, aux
                except BaseException:
                    # The caller's code failed with the message: as vLLM's
                    # block, which marks it read only once that code went
                    # through, the next read returns it again.
                    keep = True
                    raise
            finally:
                payload.release()
                area.settle(keep)
                # After the seat moved on: a reader that dies between the two
                # still pins the object, so the daemon knows it took its read.
                if pin is not None:
                    self._release(pin)
        finally:
            if claimed:
                area.unclaim()
            area.leave()
            if self.client is not None and self.client._later:
                self._send_releases()

    def _send_releases(self):
        """Send the releases kept while the client was busy (release_many
        of nothing sends what release_later queued). Still busy: they wait
        for the next call; any other failure is the connection's and shows
        at its next call (its pins went with it)."""
        try:
            self.client.release_many(())
        except ShmBrokerError:
            pass

    def _pin_object(self, raw):
        """The store object an overflow slot names (raw: its key), pinned."""
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _corrupt("an overflow slot's key is not UTF-8") from None
        if not key.startswith("q/%s/" % self.name):
            raise _corrupt("an overflow slot names key %r, not one of this queue's" % key)
        return self.client.get(key)

    def _unpickle_object(self, pin, size):
        """A message sent as a store object (its first size bytes), read in
        place from its pin."""
        views = ()
        try:
            views = _read_message(pin.view[:size])
            return _decode(views)
        finally:
            for v in views:
                v.release()

    def _release(self, pin):
        """Release an overflow message's pin; when the client is busy in
        another thread, the release is kept and sent before its next
        request (never dropped: the pin would hold the object until the
        connection closes)."""
        try:
            pin.release(noreply=True)
        except ShmBrokerError as e:
            if e.code != "EBUSY":
                raise
            pin._hand_over()
            self.client._release_later_gen(pin._gen, pin.key)

    @staticmethod
    def recv(socket, timeout):
        """vLLM's MessageQueue.recv: one message from a ZeroMQ socket (a
        pickle and its out-of-band buffers, one frame each), waiting at most
        timeout seconds (None: for ever); TimeoutError when none comes. Our
        queue never sends through a socket; this is for code that calls it
        with a socket of its own (zmq is not imported here: any object with
        poll(timeout=ms) and recv_multipart(copy=False) will do)."""
        timeout_ms = None if timeout is None else max(0, int(timeout * 1000))
        if not socket.poll(timeout=timeout_ms):
            raise TimeoutError("No message on the socket in %g s." % timeout
                               if timeout is not None else "No message on the socket.")
        first, *oob = socket.recv_multipart(copy=False)
        return pickle.loads(first, buffers=oob)

    def broadcast_object(self, obj=None):
        """The writer enqueues obj and returns it; a reader returns the next
        message (vLLM's)."""
        if self._is_writer:
            self.enqueue(obj)
            return obj
        return self.dequeue()

    def shutdown(self):
        """vLLM's: this member is shutting down (``shutting_down`` becomes
        True). A reader's waits for a message, in any thread, now and
        later, end with Cancelled (a RuntimeError saying "cancelled"); a
        message already published is still returned. The queue goes on for
        every other member, and a writer's calls are not affected. Any
        thread may call it; it never raises, even after close(). To stop
        the queue for every member, see shutdown_queue()."""
        self.shutting_down = True
        area = self._area
        if area is None or self._is_writer or self._forks != _client._forks[0]:
            return
        area.stop_reads()

    def shutdown_queue(self):
        """Shut the queue down for every member (not vLLM's: its shutdown()
        stops only the caller's waits): each wait of every member
        (enqueue, dequeue, wait_until_ready), now or later, raises
        Cancelled, as the daemon's stop does. Idempotent; any thread may
        call it, even while this queue's thread waits. Raises
        ConnectionLost after close()."""
        self._here()
        client = self.client
        if client is None:
            raise ConnectionLost("ENOTCONN", "This MessageQueue is closed; shut the queue "
                                 "down from a member still open, or with shmbrokerctl.")
        self.shutting_down = True
        req = {"op": "queue_shutdown", "name": self.name}
        try:
            client._call(req)
        except ShmBrokerError as e:
            if e.code not in ("EBUSY", "ECHILD", "ENOTCONN", "ECONNRESET"):
                raise
            # This queue's thread is in a call on the client (or it is
            # gone): say it on a connection of our own.
            with Client(client.socket_path, pool=client.pool,
                        name="mq %s shutdown" % self.name) as c:
                c._call(req)

    def close(self):
        """Leave the queue (queue_close of this member's role), unmap it and
        close the client it made. A reader's seat becomes free; the writer's
        leaving is the end of the queue for its readers. A call waiting in
        another thread wakes and raises ConnectionLost; the area is unmapped
        once no call is in it."""
        if self.closed:
            return
        self._here()
        self.closed = True
        client, self.client = self.client, None
        area, self._area = self._area, None
        if area is not None:
            area.close()
        try:
            if self._role is not None and client is not None and not client.closed:
                role, seat = self._role
                req = {"op": "queue_close", "name": self.name, "role": role}
                if seat is not None:
                    req["seat"] = seat
                try:
                    client._call(req)
                except ShmBrokerError:
                    pass  # the connection is gone, and the role with it
        finally:
            if self._own_client and client is not None:
                client.close()
