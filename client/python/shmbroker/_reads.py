# SPDX-License-Identifier: Apache-2.0
"""The catalog's reads of a Client: read(), read_into() and read_stats(),
the lookup and copy from the catalog in the mapping with no round trip
(_read, _read_at, _listed), whether the mapping may answer at all (_served),
and the count of an awaited read made in place (in the object's seal, or by
a noreply "read" request).

Client inherits Reads; the state stays on the Client (_catalog, _reads,
_poller, _looked). The catalog's layout and its checked copy are
_catalog.py's; what the catalog cannot say is asked of the daemon with get().
"""

import os
import time

from . import _catalog
from . import _protocol as P
from ._keys import check_key
from ._puts import _json_key
from ._wire import _HANGUP
from .errors import BufferTooSmall, ConnectionLost, InvalidRequest, NotFound

# How often read() looks at its connection (one poll() with no wait): a
# daemon that died without marking its segment retired (SIGKILL; a memfd
# pool has no file for the next daemon to mark) is noticed within this, as
# the C library's reads do (client/read.c, CLIENT_LOOK_MS).
_LOOK_S = 0.010
_monotonic = time.monotonic  # from the vDSO: no system call
_NOTHING = memoryview(bytearray(0))  # a buffer no payload fits in
_DELETING_MAX = 64
_EVERY_KEY = frozenset(["every key"])  # a stand-in: more deletes than that on their way
# How long read() of the key this client last put without waiting looks at
# the catalog for its commit, while that put is unanswered (the daemon
# publishes it within one wake-up, well under the round trip asking would
# cost), and for how much of that it looks again at once before it yields
# the CPU between looks: shmb_set_read_wait's default and client/read.c's.
READ_WAIT_S = 200e-6
READ_WAIT_MAX_S = 1.0  # shmb_set_read_wait's bound (SHMB_READ_WAIT_MAX)
_LANDING_SPIN_S = 20e-6


class Reads:
    """The catalog half of Client's reads: copies from the mapping, checked
    against the chunk's generation and key, and the daemon asked when the
    catalog cannot say."""

    # The key of this client's last put_nowait (Puts) and its chunk's
    # offset, and how long read() of it waits for its commit to land in the
    # catalog (seconds; 0 asks the daemon at once): the read_wait property's.
    _landing = None
    _landing_at = None
    _read_wait = READ_WAIT_S
    # Keys this client deleted without waiting since its last reply (at most
    # _DELETING_MAX; _EVERY_KEY past that): their reads ask the daemon.
    _deleting = ()

    @property
    def read_wait(self):
        """Seconds read() of the key this client last put with put_nowait()
        looks for its commit in the catalog, while that put is unanswered,
        before it asks the daemon (0 asks at once; default 200e-6). 0 to
        1.0, as shmb_set_read_wait: a NaN or an infinite wait would never
        end when the commit never lands (the daemon died)."""
        return self._read_wait

    @read_wait.setter
    def read_wait(self, seconds):
        if (type(seconds) not in (int, float) or not 0 <= seconds <= READ_WAIT_MAX_S):
            raise InvalidRequest("EINVAL", "read_wait is %.40r: it takes 0 to %g seconds (a "
                                 "number; 0 asks the daemon at once). It stays %g."
                                 % (seconds, READ_WAIT_MAX_S, self._read_wait))
        self._read_wait = seconds

    def read(self, key):
        """The object's bytes, copied out, counted as one read (as get()).

        Read from the catalog the daemon publishes in the segment, with no
        system call: the copy is checked against the chunk's generation and
        key after it is made, so it is exactly the bytes committed under
        key. When the catalog cannot say (none, the table moving, the object
        changing under the copy, a catalog that does not list everything),
        asks the daemon: get, copy, release (one round trip). NotFound when
        no committed object has key. ConnectionLost (ECONNRESET) once the
        daemon stopped or died, within 20 ms of it: never an answer from a
        segment no daemon serves. read_stats() counts which way reads
        went. Use get() to read a large object in place, without a copy."""
        return self._read(check_key(key), None)

    def read_into(self, key, buffer):
        """read() into buffer (any writable buffer: bytearray, memoryview, a
        numpy array...) instead of new bytes; returns how many bytes were
        written at its start. BufferTooSmall (its ``.size``: the object's)
        when the object is larger than buffer; nothing is written then."""
        out = memoryview(buffer)
        if out.readonly:
            out.release()
            raise TypeError("read_into() needs a writable buffer.")
        try:
            return self._read(check_key(key), out.cast("B") if out.format != "B" or
                              out.ndim != 1 else out)
        finally:
            out.release()

    def read_stats(self):
        """How this client's read() and read_into() calls went: a dict of
        "fast" (answered from the mapping: hits and proven misses),
        "fallback" (answered by the daemon) and "retries" (copies redone
        after a change under them)."""
        return {"fast": self._reads[0], "fallback": self._reads[1],
                "retries": self._reads[2]}

    def _served(self, cat, key):
        """Whether the mapping may answer: the daemon has not marked the
        segment retired, and (looked at every _LOOK_S) the daemon's end of
        the connection is open. False (ask the daemon, which knows) when
        retired, or a word a client scribbled; ConnectionLost when the
        daemon closed the connection (stopped or died), after closing ours,
        so that the calls after it fail too."""
        if cat.w32[P.SEGMENT_RETIRED_AT >> 2] != 0:
            return False
        now = _monotonic()
        if now - self._looked < _LOOK_S:
            return True
        try:
            events = self._poller.poll(0)
        except (OSError, AttributeError):
            return True  # a failed poll proves nothing: the next read looks
        self._looked = now
        if not any(ev & _HANGUP for _fd, ev in events):
            return True
        self._disconnect(keep_map=True)
        raise ConnectionLost("ECONNRESET", "read() of '%s': shmbrokerd closed this client's "
                             "connection (it stopped, or died), so the segment this client "
                             "maps may be one no daemon serves; nothing was read from it. "
                             "Every pin and pending allocation of this client was released. "
                             "Call reconnect() and read again." % key)

    def _read(self, key, out):
        # One call at a time, as every other (and shmb_read): a read from
        # the mapping under another thread's call could meet its reconnect()
        # replacing the mapping, or its close() releasing the views.
        self._enter()
        try:
            hit = self._read_catalog(key, out)
        finally:
            self._busy.release()
        if hit is not None:
            return hit[0]
        self._reads[1] += 1
        pin = self.get(key)
        try:
            if out is None:
                return bytes(pin.view)
            if pin.size > len(out):
                raise _too_small(key, len(out), pin.size)
            out[:pin.size] = pin.view
            return pin.size
        finally:
            pin.release()

    def _read_at(self, key):
        """key's bytes read from the catalog with no round trip, and where:
        (bytes, chunk header offset, generation), its awaited read counted
        as read() counts it. None when the catalog cannot say (ask the
        daemon: read()); NotFound when no committed object has key."""
        self._enter()
        try:
            return self._read_catalog(key, None)
        finally:
            self._busy.release()

    def _read_catalog(self, key, out):
        """The read of key from the catalog that read() and _read_at() make,
        holding the client's lock: (what cat.read gave, chunk header offset,
        generation) for a hit, counted in read_stats() with its retries and
        its awaited read counted; None when the catalog cannot say (ask the
        daemon). NotFound when no committed object has key, BufferTooSmall
        when out cannot hold it."""
        cat = self._catalog
        if cat is None or not self._served(cat, key):
            return None
        if self._deleting and (key in self._deleting or self._deleting is _EVERY_KEY):
            return None  # its delete may be on its way: the daemon answers after it
        raw = key.encode("utf-8", "surrogatepass")
        what, value, gen, flags, chunk, retries = cat.read(cat.lookup(key, raw), out)
        self._reads[2] += retries
        if self._unconfirmed[0] > 0:
            # A miss proves nothing while puts sent without waiting are
            # unanswered: their commits may not be handled yet. The last
            # one's is looked for a moment; else the daemon, which handles
            # the connection's requests in order, answers after them. Nor
            # is a hit of the last one's key in another chunk its own: an
            # object this client deleted without waiting just before the
            # put, the delete on its way too (or one of another client that
            # makes the daemon refuse the put: the daemon then says so).
            if key == self._landing:
                if ((what != _catalog.HIT and what != _catalog.NOBUFS)
                        or chunk != self._landing_at):
                    what, value, gen, flags, chunk = self._read_landing(cat, key, raw, out)
            elif what != _catalog.HIT and what != _catalog.NOBUFS:
                return None
        if what == _catalog.HIT:
            self._reads[0] += 1
            if flags & P.CATALOG_AWAITED:
                self._count_read(key, chunk, gen)
            return value, chunk, gen
        if what == _catalog.MISS:
            self._reads[0] += 1
            raise NotFound("ENOENT", "No committed object has key '%s'." % key)
        if what == _catalog.NOBUFS:
            self._reads[0] += 1
            raise _too_small(key, len(out), value)
        return None

    def _deleting_sent(self, key):
        """A delete of key sent without waiting (holding the client's lock)."""
        if self._deleting is _EVERY_KEY:
            return
        if not self._deleting:
            self._deleting = set()
        if len(self._deleting) >= _DELETING_MAX:
            self._deleting = _EVERY_KEY
        else:
            self._deleting.add(key)

    def _read_landing(self, cat, key, raw, out):
        """cat.read() of key again until it hits the last put's chunk
        (_landing_at) or read_wait ends, looking
        again at once for _LANDING_SPIN_S, then yielding the CPU between
        looks (the daemon may be waiting for this one). A miss at the end
        says nothing (the caller asks the daemon)."""
        start = _monotonic()
        deadline = start + self.read_wait
        spin_end = start + _LANDING_SPIN_S
        while True:
            now = _monotonic()
            if now >= deadline:
                return None, None, 0, 0, 0
            if now >= spin_end:
                os.sched_yield()
            what, value, gen, flags, chunk, retries = cat.read(cat.lookup(key, raw), out)
            self._reads[2] += retries
            if (what == _catalog.HIT or what == _catalog.NOBUFS) and chunk == self._landing_at:
                return what, value, gen, flags, chunk

    def _count_read(self, key, chunk, gen):
        """Count one awaited read of the object read in place (inside the
        read's call): in its seal (a compare-and-swap that keeps the
        generation) on a read-write mapping, else by a noreply "read"
        request. An object that went meanwhile (another generation) counts
        nothing: its reads no longer matter. The read itself was exact: a
        connection lost while reporting it is the next call's news, as in
        shmb_read."""
        if not self.read_only:
            base, cas64 = self._arena_base()  # the mapping's address, and the CAS
            if base is not None:
                addr = base + chunk + P.SEAL_AT
                w64 = self._catalog.w64
                i = (chunk + P.SEAL_AT) >> 3
                # Bounded: other processes may keep changing the seal (the
                # daemon folding counts in, or a hostile writer); then the
                # daemon counts it.
                for _ in range(1000):
                    seal = w64[i]
                    if seal & 0xFFFFFFFF != gen or seal >> 32 == 0xFFFFFFFF:
                        return
                    if cas64(addr, seal, seal + (1 << 32)) == seal:
                        return
        try:
            self._send_read_count(key, gen)
        except ConnectionLost:
            pass  # _send closed the socket: the next call says so

    def _listed(self, key):
        """Whether a committed object has key, from the catalog in the
        mapping (no round trip): True, False, or None when the catalog
        cannot say (ask the daemon)."""
        self._enter()
        try:
            cat = self._catalog
            if cat is None or not self._served(cat, key):
                return None
            if self._deleting and (key in self._deleting or self._deleting is _EVERY_KEY):
                return None
            raw = key.encode("utf-8", "surrogatepass")
            if cat.absent(raw):
                return False
            what = cat.read(cat.lookup(key, raw), _NOTHING)[0]
        finally:
            self._busy.release()
        if what == _catalog.NOBUFS:
            return True  # found, committed: its bytes do not fit in nothing
        return False if what == _catalog.MISS else None

    def _send_read_count(self, key, gen):
        """Send {"op":"read","key":key,"gen":gen} without a reply (holding
        this client's lock), the line built by hand: one per read in place."""
        out = self._pending_lines() if self._later else []
        out.append(b'{"op":"read","key":%s,"gen":%d,"noreply":true,"id":%d}\n'
                   % (_json_key(key), gen, self._next_id()))
        self._send(b"".join(out))

    def _count_in_place(self, key, chunk, gen):
        """Count one awaited read of the object of key, read in place at
        chunk (its header's offset) under generation gen: in its seal on a
        read-write mapping, else by a noreply "read" request."""
        self._enter()
        try:
            if self._catalog is None and not self.read_only:
                self._send_read_count(key, gen)
            else:
                self._count_read(key, chunk, gen)
        finally:
            self._busy.release()


def _too_small(key, cap, size):
    return BufferTooSmall("ENOBUFS", "A buffer of %d bytes cannot hold '%s', which is %d "
                          "bytes; nothing was copied." % (cap, key, size), size)
