# SPDX-License-Identifier: Apache-2.0
"""One member's view of a queue's area: the mapping and its checked
geometry, the header's and seats' words, the writer's reserve and publish,
a reader's dequeue and done, the member's turn, and close.

The waits for a slot or a message are _Waiting's (_queue_wait), mixed in;
the layout is _queue_layout's. It knows nothing of messages' encoding or
of the daemon: MessageQueue (queue) opens the area and hands it the mapping.
"""

import struct
import threading

from . import _futex
from ._queue_layout import (ALIGN, HEADER_PAGE, NAME_MAX, QUEUE_MAGIC, QUEUE_VERSION, SEAT_LIVE,
                            SEAT_OFFSETS, SEAT_SIZE, SLOT, SLOT_HEADER, SLOT_INLINE, SLOT_OBJECT,
                            _GEOMETRY, _H, _corrupt, _round_up, _slots_offset_for, queue_size)
from ._queue_rhythm import _Rhythm
from ._queue_wait import (SPIN_START_NS, _POLL_AHEAD, _POLL_WAITS, _Waiting, _usable_cpus,
                          _wait_settings)
from .errors import ConnectionLost, InvalidRequest, ProtocolError, ShmBrokerError, Unsupported

# A slot's seq and flags (the first two of SLOT's fields).
_SEQ_FLAGS = struct.Struct("=QI")


class _Area(_Waiting):
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
        # What the reader learns of its messages' rhythm, and the time of
        # its last look that found no message (the lower bound of when the
        # next one came).
        self._rhythm = _Rhythm()
        self._empty_at = 0
        self.naps = 0         # naps ahead of a message (tests look at these)
        self.rhythm_polls = 0  # polls after a nap, and their yields
        self.rhythm_yields = 0
        # Waits that poll once this reader is found behind (none without a
        # spin budget).
        self._poll_waits = _POLL_WAITS if self.spin_max_ns else 0
        self._poll_left = 0   # waits left that poll (back to back, _poll)
        self._ahead = 0       # messages published for this seat at the last look
        self._poll_tries = self._poll_misses = 0
        self._polls_off = 0   # waits left before polls are tried again
        self.polls = 0        # waits that polled
        self.yields = 0       # their yields
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
        # The two atomic operations of every message, on words fixed from
        # now on: the writer's bump of head_word, a reader's move of its
        # seat's next (_futex.bind: cheaper calls than fetch_add32's and
        # cas64's). The Bound keeps its code for as long as this area.
        self._ops = _futex.bind(self._head_word_addr, 1,
                                self._next_addr if seat is not None else None)
        self._bump_head = self._ops.add32
        self._advance_next = self._ops.cas_next64

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

    # ---- the writer ---------------------------------------------------------

    def reserve(self, timeout, warn=True):
        """Wait until the next slot is free; returns (its payload, a writable
        memoryview of slot_size bytes, and the (flags, seq) it held)."""
        at, flags, seq = self.reserve_at(timeout, warn)
        return self._mv[at:at + self.slot_size], flags, seq

    def reserve_at(self, timeout, warn=True):
        """reserve() without making a view: (the offset of the slot's payload
        in the mapping, and the flags and seq it held). A small message is
        written there in place (_queue_messages)."""
        if self.head is None:
            self.head = self.published()
        if not self._writer_ready():
            self._wait(True, timeout, warn=warn)
        self._reserved = True
        off = self.slots_offset + self.head % self.slots * self.stride
        seq, flags = _SEQ_FLAGS.unpack_from(self._mv, off)
        return off + SLOT_HEADER, flags, seq

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
        SLOT.pack_into(self._mv, self.slots_offset + n % self.slots * self.stride, n, flags,
                       length, aux, 0)
        self._reserved = False
        self.head = n + 1
        # head is the store that publishes the slot (with release order:
        # the fence before it, or x86-64's own); head_word, the futex word,
        # is bumped after it by a read-modify-write, which also fences
        # before readers_waiting is read.
        if self._release is not None:
            self._release()
        self._q64[16] = n + 1
        self._bump_head()  # fetch_add32(head_word, 1)
        if self._q32[49]:  # readers_waiting
            _futex.futex_wake(self._head_word_addr, _futex.INT_MAX)

    # ---- a reader -------------------------------------------------------------

    def dequeue(self, timeout, cancel=None, warn=False):
        """The next message at this seat, in place: (flags, payload view,
        aux), valid until done() or the next dequeue."""
        flags, at, length, aux = self.take(timeout, cancel, warn)
        return flags, self._mv[at:at + length], aux

    def take(self, timeout, cancel=None, warn=False):
        """dequeue() without making a view: (flags, the offset of the
        payload in the mapping, its length, aux), valid until done() or the
        next take. A small message is read there in place (_queue_messages)."""
        if self._held is not None:
            self.done()
        if not self._reader_ready():
            self._wait(False, timeout, cancel, warn)
        elif (not self._polls_off and self._ahead >= _POLL_AHEAD
              and 0 < self._gap <= self.spin_max_ns):
            self._poll_left = self._poll_waits  # as _wait's _ready_at_once
        self.seen()
        n = self._q64[self._i_next]
        off = self.slots_offset + n % self.slots * self.stride
        seq, flags, length, aux, _ = SLOT.unpack_from(self._mv, off)
        if seq != n or length > self.slot_size or (flags != SLOT_INLINE
                                                   and flags != SLOT_OBJECT):
            raise _corrupt("slot %d holds message %d (flags %d, %d bytes) where message %d "
                           "was published" % (n % self.slots, seq, flags, length, n))
        self._held = n
        return flags, off + SLOT_HEADER, length, aux

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
        if self._advance_next(held) != held:  # cas64(next, held, held + 1)
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
