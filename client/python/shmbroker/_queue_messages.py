# SPDX-License-Identifier: Apache-2.0
"""The messages of a MessageQueue: the writer's enqueue() and acquire_write(),
a reader's dequeue() and acquire_read(), and the overflow objects of messages
larger than a slot (their keys, pins and releases).

_Messages is mixed into MessageQueue (queue), whose area, client and role
it uses; opening, readiness, shutdown and close are MessageQueue's. A
message's bytes are _queue_codec's, the slot's waits and turns _Area's.
"""

import contextlib

from . import client as _client
from ._queue_codec import (DIRECT_MAX_FRAMES, DIRECT_MIN, _FRAMES_MAGIC, _ONE_FRAME_AT,
                           _ONE_FRAME_HEADER, _PICKLED, _buffer_frames, _decode, _decode_at,
                           _decode_payload, _dumps, _message_size, _pickle_into,
                           _read_message, _write_message)
from ._queue_layout import SLOT_INLINE, SLOT_OBJECT, _corrupt
from .pickling import _frames_of
from .errors import ConnectionLost, InvalidRequest, KeyExists, NotFound, ShmBrokerError


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


class _Messages:
    """The data path of a MessageQueue (mixed into it): writing and reading
    messages in the slots, and the overflow objects of larger ones."""

    # Whether the writer's next pickled message goes straight into its slot
    # (_queue_codec's "pickled straight into a slot"): its last one was at
    # least DIRECT_MIN and fitted a slot.
    _direct = False

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
        # _area_for_call(), inline on the path of every message.
        if self._forks != _client._forks[0]:
            self._here()
        area = self._area
        if area is None:
            raise ConnectionLost("ENOTCONN", "This MessageQueue is closed.")
        # Most messages are of a type that is never a buffer: no call to
        # look further.
        bufs = None if type(obj) in _PICKLED else _buffer_frames(obj)
        if bufs is None and not self._direct:
            oob = []
            stream = _dumps(obj, 5, buffer_callback=oob.append)
            n = len(stream)
            if not oob and n < DIRECT_MIN and _ONE_FRAME_AT + n <= area.slot_size:
                # Most messages: a small pickle in one frame, written in
                # place with no frames list and no view of the slot (a
                # large one goes by _enqueue, which says whether the next
                # is pickled straight into its slot).
                area.begin(_WRITE_BUSY)
                try:
                    self._enqueue_stream(area, stream, timeout)
                finally:
                    area.end()
                return
            bufs = _frames_of(stream, oob)
        area.begin(_WRITE_BUSY)
        try:
            self._enqueue(area, bufs, timeout, obj)
        finally:
            area.end()

    def _enqueue_stream(self, area, stream, timeout):
        """Write a pickle stream that fits a slot, as the message's one
        frame, into the next slot; the caller holds the writer's turn."""
        try:
            at, old_flags, old_seq = area.reserve_at(timeout)
            if old_flags == SLOT_OBJECT:
                self._drop_object(area, old_seq)
            n = len(stream)
            mv = area._mv
            _ONE_FRAME_HEADER.pack_into(mv, at, _FRAMES_MAGIC, 1, 0, n)
            mv[at + _ONE_FRAME_AT:at + _ONE_FRAME_AT + n] = stream
            area.publish(SLOT_INLINE, _ONE_FRAME_AT + n)
        finally:
            area._reserved = False

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
        if old_flags == SLOT_OBJECT:
            try:
                self._drop_object(area, old_seq)
            except BaseException:
                payload.release()
                area._reserved = False
                raise
        return payload

    def _drop_object(self, area, old_seq):
        """The reserved slot held an overflow object's key (old_seq: the
        message it was): the object goes now, once, whatever the next
        message becomes; every live reader is done with it."""
        n = area.head
        if n >= area.slots and old_seq == n - area.slots:
            area.forget_slot()
            self.client.delete(self._object_key(old_seq), noreply=True)

    def _area_for_call(self):
        """The area, once this process is the queue's and it is open."""
        self._here()
        area = self._area
        if area is None:
            raise ConnectionLost("ENOTCONN", "This MessageQueue is closed.")
        return area

    def _enqueue(self, area, bufs, timeout, obj=None):
        """Write the message of frames bufs (None: obj, pickled straight into
        the slot) into the next slot, or into an overflow object."""
        payload = self._reserve(area, timeout)
        try:
            n = area.head
            if bufs is None:
                total = _pickle_into(payload, obj)
                if type(total) is int:
                    # Straight into the slot while messages are large.
                    self._direct = total >= DIRECT_MIN
                    area.publish(SLOT_INLINE, total)
                    return
                # Larger than the slot, or too many buffers for its
                # header: the frames pickled (once), sent as dumps' are.
                self._direct, bufs = False, total
            total = _message_size(bufs)
            if bufs[0].nbytes >= DIRECT_MIN and len(bufs) <= DIRECT_MAX_FRAMES:
                # A large stream: the next message goes straight into its
                # slot when this one fits one.
                self._direct = total <= area.slot_size
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
        if self._forks != _client._forks[0]:
            self._here()
        area = self._area
        if area is None:
            raise ConnectionLost("ENOTCONN", "This MessageQueue is closed.")
        area.begin(_READ_BUSY)
        try:
            flags, at, length, aux = area.take(timeout, cancel, not indefinite)
            if flags == SLOT_INLINE:
                try:
                    obj = _decode_at(area._mv, at, length)
                except BaseException:
                    area.keep()  # an error leaves the message for the next call
                    raise
                area.done()
                return obj
            area.keep()  # an object: _message below takes it again
        finally:
            area.end()
            if self.client is not None and self.client._later:
                self._send_releases()
        with self._message(timeout, cancel, not indefinite) as (flags, held, size):
            if flags == SLOT_OBJECT:
                return self._unpickle_object(held, size)
            return _decode_payload(held)

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
