# SPDX-License-Identifier: Apache-2.0
"""The connection to shmbrokerd: hello, the mapped segment, and every op.

One Client is one connection and one mapping of the daemon's segment. Object
bytes never cross the socket: a request names a key, the reply gives an
offset, and the bytes are read or written through the mapping. This module
holds the public class and its calls (pins, allocations, batches); the
arena's puts are _puts.py's, the reads from the catalog _reads.py's, the
wire (connecting, hello, the line exchange, replies and errors) _wire.py's,
the mapping (the segment, its checks, chunk headers) _mapping's, the key
check _keys.py's, and the frames layout frames.py's.
"""

import collections
import json
import operator
import threading
import warnings
import weakref

from . import _arena
from . import _protocol as P
from . import frames as _frames
from ._keys import _check_keys, _key_list, check_key
from ._mapping import Mapping, _release_view
from ._puts import Puts, _json_key, _prepare, _write  # noqa: F401
from ._reads import Reads
from ._wire import Wire, _NOT_SENT, _NO_ID, _check_values, _forks
from ._wire import _reply_error, _reply_list, default_socket_path, user_socket_path  # noqa: F401
from .errors import ConnectionLost, InvalidRequest, ProtocolError, ShmBrokerError

__all__ = ["Client", "Allocation", "Pin", "ObjectList", "default_socket_path", "check_key"]

# The arena a connection asks for by default (SHMB_ARENA_DEFAULT): room for
# many small puts per round trip; a larger object asks for four times its size.
ARENA_DEFAULT = 256 * 1024


class ObjectList(list):
    """The objects of a list() call: a list of dicts (key, offset, size, pins,
    readers, state, age_ms), oldest first.

    ``.truncated`` is True when more objects matched than the reply holds
    (more than the limit, or more than about 4 MiB of reply): list again with
    a longer prefix to see them."""

    def __init__(self, objects=(), truncated=False):
        super().__init__(objects)
        self.truncated = truncated


class _Extent:
    """What Allocation and Pin share: a key's bytes in the segment, valid
    for as long as the connection that got them (its generation)."""

    __slots__ = ("key", "offset", "size", "view", "_client", "_gen", "__weakref__")

    def __init__(self, client, key, offset, size, view):
        self._client = client
        self._gen = client._gen
        self.key = key
        self.offset = offset
        self.size = size
        self.view = view
        client._extents.add(self)

    def _connection_lost(self):
        """The connection went, and the pin or allocation with it. A Pin's
        view stays readable, unprotected, as the C library's pointers do
        (reconnect() keeps the mapping so that they do); Allocation takes
        its writable view away."""


class Allocation(_Extent):
    """A pending object: space reserved by alloc(), written through ``.view``.

    Attributes: ``key``, ``offset`` (in the segment), ``size``, and ``view``,
    a writable memoryview of exactly ``size`` bytes of the segment. Nobody
    sees the object until commit(). As a context manager it commits on a
    normal exit and aborts when the block raises. After commit() or abort()
    the view is released (using it raises ValueError), unless something still
    exports it; writing it then is writing bytes that are no longer yours.
    """

    __slots__ = ("done",)

    def __init__(self, client, key, offset, size, view):
        super().__init__(client, key, offset, size, view)
        self.done = False

    def _connection_lost(self):
        # Writing through it now could change another client's object, one
        # allocated at the same offset since.
        _release_view(self.view)

    def commit(self):
        """Make the object visible to everyone (raises on the daemon's error,
        e.g. Timeout when --alloc-timeout dropped the allocation)."""
        if self.done:
            raise InvalidRequest("EINVAL", "The allocation of '%s' was already committed or "
                                 "aborted." % self.key)
        if self._client._gen != self._gen:
            self.done = True
            raise ConnectionLost("ECONNRESET", "The allocation of '%s' went with the connection "
                                 "that made it (it was lost or reconnected); nothing was sent. "
                                 "Allocate it again." % self.key)
        self.done = True
        _release_view(self.view)
        try:
            self._client._call({"op": "commit", "key": self.key})
        except ShmBrokerError as e:
            if e.code in _NOT_SENT:
                self.done = False  # refused before sending: commit() may be called again
            raise

    def abort(self):
        """Drop the allocation: the key is free again, its bytes go back."""
        if self.done:
            return
        self.done = True
        _release_view(self.view)
        if self._client._gen == self._gen and self._client._sock is not None:
            try:
                self._client._call({"op": "abort", "key": self.key})
            except ShmBrokerError as e:
                if e.code in _NOT_SENT:
                    self.done = False
                raise

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            if not self.done:
                self.commit()
        else:
            try:
                self.abort()
            except ShmBrokerError:
                pass  # the block's exception is the one to see
        return False

    def __repr__(self):
        return "<shmbroker.Allocation %r offset=%d size=%d%s>" % (
            self.key, self.offset, self.size, " done" if self.done else "")


class Pin(_Extent):
    """A pinned object, from get(): its bytes stay valid and unchanged until
    release.

    Attributes: ``key``, ``offset``, ``size``, ``view`` (a read-only memoryview
    of the payload, in the segment: no copy), ``frames`` (the payload parsed
    as frames, a list of read-only memoryviews; ProtocolError when it is not
    in that layout), ``released``.

    Release it with release() or by leaving a ``with`` block; closing the
    client, or losing its connection, releases every pin too.

    A Pin garbage-collected unreleased keeps its daemon pin (release(key)
    and close() still drop it: the pins are the connection's, as in C), and
    gives a ResourceWarning, as an unclosed file does, so that a forgotten
    pin shows up under ``python -X dev`` or ``-W error::ResourceWarning``.

    Releasing while a view is still exported (``np.frombuffer(pin.view)``)
    does not crash: the daemon's pin goes, the memory stays mapped as long as
    the array lives, but its bytes are no longer protected and may be
    overwritten by a later object. Otherwise the view is released and using
    it raises ValueError.
    """

    __slots__ = ("_frames", "released")

    def __init__(self, client, key, offset, size, view):
        super().__init__(client, key, offset, size, view)
        self._frames = None
        self.released = False

    @property
    def frames(self):
        """The payload's frames: a list of read-only memoryviews into the
        segment (parsed on first use; ProtocolError if not frames)."""
        if self._frames is None:
            if self.released:
                raise ValueError("The pin of '%s' was released." % self.key)
            self._frames = _frames.parse(self.view)
        return self._frames

    def release(self, *, noreply=True):
        """Drop this pin. Does nothing when already released or when the
        connection that took it is gone (its pins went with it).

        The release is sent without awaiting a reply (noreply=False awaits
        it): the pin is this client's own, so it cannot fail unless the
        connection is gone, and a reader then pays no round trip for it."""
        if self.released:
            return
        self.released = True
        for f in self._frames or ():
            _release_view(f)
        self._frames = None
        _release_view(self.view)
        c = self._client
        if c._gen == self._gen and c._sock is not None:
            try:
                c.release(self.key, noreply=noreply)
            except ShmBrokerError as e:
                if e.code in _NOT_SENT:
                    self.released = False
                raise

    def _hand_over(self):
        """Mark the pin released without releasing it: its daemon pin now
        belongs to whoever called this (loads_from's keeper)."""
        self.released = True

    def __del__(self):
        if self.released:
            return
        c = self._client
        try:
            if c._gen == self._gen and c._sock is not None:
                warnings.warn("Pin of %r garbage-collected without release(): the daemon "
                              "pin stays until release(%r) or close()" % (self.key, self.key),
                              ResourceWarning, source=self)
        except Exception:  # interpreter shutdown: modules may be gone already
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.release()
        else:
            try:
                self.release()
            except ShmBrokerError:
                pass
        return False

    def __len__(self):
        return self.size

    def __repr__(self):
        return "<shmbroker.Pin %r offset=%d size=%d%s>" % (
            self.key, self.offset, self.size, " released" if self.released else "")


class Client(Wire, Mapping, Puts, Reads):
    """A connection to shmbrokerd and a mapping of its shared-memory segment.

    ``Client(socket_path=None, *, name=None, read_only=False, populate=True,
    pool=None)``

    socket_path defaults to $SHMBROKER_SOCKET, else
    /run/shmbroker/shmbroker.sock. name labels the connection in the daemon's
    log and ``clients()``. read_only connects with hello's "mode":"ro": the
    segment is mapped PROT_READ and every writing op raises PermissionDenied
    (a noreply one, touch or delete with noreply=True, is dropped by the
    daemon without a word, as the protocol has it). populate maps with
    MAP_POPULATE, so that first touches do not fault. pool names the daemon's
    pool to use (a daemon may serve several, each its own segment, keys and
    limits); None or "" is its default pool. hello names it, reconnect()
    names it again; a pool the daemon does not have raises NotFound listing
    its pools, one restricted to a group the caller is not in
    PermissionDenied.

    Writes: put(), put_nowait() (through an arena, not waiting; sync()
    waits for those), alloc(); reads: get() (a zero-copy Pin), read() and
    read_into() (a copy, from the segment's catalog with no round trip),
    get_frames(), read_frames(); and touch, delete, contains (``key in c``),
    list, stats, clients, put_many, get_many, release_many.

    Errors are exceptions of shmbroker.errors, each a subclass of the
    built-in that fits (NoSpace is a MemoryError, NotFound a LookupError...).
    A lost connection raises ConnectionLost; reconnect() connects again and
    keeps the mapping when the daemon serves the same segment file.

    Every request carries an integer id, and a reply with another id (or
    none) resets the connection rather than being taken for this call's.

    One client per thread (a call made while another thread's runs on the
    same client raises ShmBrokerError EBUSY; close() it from the thread
    that uses it), and one process: a client connected before fork()
    refuses calls in the child. Calls have no timeout, as in C: a daemon
    stopped with SIGSTOP makes them wait.

    Attributes: socket_path, name, read_only, pool, closed, info (the hello
    reply: segment, size, data_offset, data_size, max_object_size, alignment,
    mode, and from a daemon with pools, pool and backing).
    """

    def __init__(self, socket_path=None, *, name=None, read_only=False, populate=True,
                 pool=None):
        if pool is not None and not isinstance(pool, str):
            raise TypeError("pool is a str (a pool's name), not %s." % type(pool).__name__)
        if pool and len(pool.encode("utf-8", "surrogatepass")) > P.POOL_NAME_MAX:
            raise InvalidRequest("EINVAL", "Pool name of %d bytes: pool names are 1 to %d of "
                                 "A-Z, a-z, 0-9, '_' and '-'. Nothing was sent."
                                 % (len(pool.encode("utf-8", "surrogatepass")),
                                    P.POOL_NAME_MAX))
        self.socket_path = default_socket_path(socket_path)
        self.name = name
        self.pool = pool or None
        self.read_only = bool(read_only)
        self.populate = bool(populate)
        self.closed = False
        self.info = {}
        self._sock = None
        self._poller = None  # select.poll() of _sock, for read()'s look
        self._looked = 0.0   # when read() last looked (time.monotonic())
        self._mmap = None
        self._mv = None
        self._map_file = None  # (st_dev, st_ino, size) of the mapped file
        self._rbuf = bytearray()
        self._last_id = 0
        self._gen = 0
        self._later = collections.deque()
        self._extents = weakref.WeakSet()  # live Pins and Allocations
        self._busy = threading.Lock()
        self._forks = _forks[0]
        self._data_end = 0
        self._catalog = None  # _catalog.Catalog of the mapping, or None
        # (anchor, address, cas64) of a read-write mapping, for the seal's CAS
        self._seal_base = None
        self._reads = [0, 0, 0]  # read(): fast, fallback, retries
        self._arena = _arena.Arena()
        # The id of an arena request a commit sent without waiting, its
        # reply not read yet (read before any later reply: _take_due_arena).
        self._arena_due = None
        self.arena_want = ARENA_DEFAULT  # 0: puts go without an arena
        # Puts sent without waiting that no reply has confirmed since:
        # [count, the first one's key]; and those refused or maybe lost,
        # until a put or sync() reports them: [count, key, code, message].
        self._unconfirmed = [0, None]
        self._lost_puts = [0, None, None, None]
        self._replies = 0  # replies read: one after a put proves it handled
        self._dial(keep_map=False)

    # ---- connection ------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self.closed else ("connected" if self._sock else "disconnected")
        return "<shmbroker.Client %s %s%s%s>" % (self.socket_path, state,
                                                 " pool=%s" % self.pool if self.pool else "",
                                                 " read-only" if self.read_only else "")

    def close(self):
        """Close the connection (the daemon releases every pin and pending
        allocation of it) and unmap the segment.

        When views of the segment are still exported (a Pin's view, a numpy
        array made from one), the mapping is left to the garbage collector:
        it stays valid until the last of them goes, so nothing crashes, but
        the bytes are no longer protected by any pin."""
        if self.closed:
            return
        self.closed = True
        self._disconnect(keep_map=False)


    # ---- raw requests ----------------------------------------------------

    def request(self, obj):
        """Send one raw request (a dict, as in proto/PROTOCOL.md) and return
        the daemon's reply as a dict, ``ok`` true or false: it never raises for
        an error reply. The client adds an integer "id" unless obj has one
        (the reply must then carry that). A request with "noreply": true on
        an op that takes it is sent and None is returned (on any other op
        the daemon answers it, and so does this). Offsets in replies are not
        checked here."""
        if not isinstance(obj, dict):
            raise TypeError("A request is a dict, not %s." % type(obj).__name__)
        req = dict(obj)
        op = req.get("op")
        if (req.get("noreply") is True and isinstance(op, str)
                and P.OPS.get(op, 0) & P.OPF_NOREPLY):
            self._enter()
            try:
                if "id" not in req:
                    req["id"] = self._next_id()
                self._send(self._encode(req))
            finally:
                self._busy.release()
            return None
        self._enter()
        try:
            return self._exchange(req, want=req["id"] if "id" in req else _NO_ID)
        finally:
            self._busy.release()

    # ---- objects -----------------------------------------------------------

    def alloc(self, key, size, *, readers=0, wait_ms=None):
        """Reserve size bytes for key and return an Allocation whose ``.view``
        is a writable memoryview of them.

        readers: gets the object awaits before it may be evicted.
        wait_ms: when there is no room, wait up to this long for it (the
        connection is busy meanwhile) before raising Timeout.
        Raises NoSpace, ObjectTooLarge, KeyExists, PermissionDenied..."""
        key = check_key(key)
        size = operator.index(size)  # an integer: 1.5 bytes is a bug, not 1
        req = {"op": "alloc", "key": key, "size": size}
        if readers:
            req["readers"] = readers
        if wait_ms is not None:
            req["wait_ms"] = wait_ms
        reply = self._call(req)
        try:
            off, size = self._extent(reply, size)
        except ProtocolError:
            self._send_noreply({"op": "abort", "key": key})
            raise
        return Allocation(self, key, off, size, self._mv[off:off + size])

    def put(self, key, data, *, readers=0, wait_ms=None):
        """Store an object and return its payload offset.

        data: any object with the buffer protocol (bytes, bytearray,
        memoryview, a numpy array, array.array...), copied once into the
        segment; or a list or tuple of them, stored as frames (see
        get_frames). Raises as alloc() does; the allocation is aborted if
        the copy fails."""
        part, total = _prepare(data)
        # The allocation commits when the copy went through and aborts when
        # it raised (an abort's own failure hidden behind the copy's).
        with self.alloc(key, total, readers=readers, wait_ms=wait_ms) as a:
            _write(a.view, part)
        return a.offset

    def get(self, key):
        """Pin the object and return a Pin whose ``.view`` is a read-only
        memoryview of its bytes, valid until the pin is released. Raises
        NotFound when there is no such committed object."""
        key = check_key(key)
        reply = self._call({"op": "get", "key": key})
        try:
            off, size = self._extent(reply)
        except ProtocolError:
            self._send_noreply({"op": "release", "key": key})
            raise
        return Pin(self, key, off, size, self._mv[off:off + size].toreadonly())

    def get_frames(self, key):
        """get() and parse the payload as frames: a Pin whose ``.frames`` is
        the list of read-only memoryviews. ProtocolError (the pin released)
        when the object is not in the frames layout."""
        pin = self.get(key)
        try:
            pin.frames
        except BaseException:
            pin.release()
            raise
        return pin

    def read_frames(self, key):
        """The object's frames, each copied out as bytes (the pin is
        released at once)."""
        pin = self.get_frames(key)
        try:
            return [bytes(f) for f in pin.frames]
        finally:
            pin.release()

    def release(self, key, *, noreply=False):
        """Drop one of this connection's pins on key (Pin.release calls it).
        With noreply, nothing is awaited and a failure is only counted by
        the daemon."""
        key = check_key(key)
        if noreply:
            self._send_noreply({"op": "release", "key": key})
        else:
            self._call({"op": "release", "key": key})

    def release_later(self, key):
        """Queue a release of key, sent without a reply before this client's
        next request (or dropped with the connection, which releases it all
        the same). Safe from a weakref finalizer or __del__, even in another
        thread: it never touches the socket."""
        self._later.append((self._gen, check_key(key)))

    def _release_later_gen(self, gen, key):
        """release_later() of a pin taken on connection generation gen: after
        a reconnect it is dropped (the old connection's pins went with it),
        so that it never releases a new pin of the same key."""
        self._later.append((gen, key))

    def release_many(self, keys):
        """Release one pin on each key, without awaiting replies (one
        noreply line each). Every key is checked before anything is sent."""
        keys = _check_keys(_key_list(keys))
        self._enter()
        try:
            out = self._pending_lines() if self._later else []
            size = sum(len(b) for b in out)
            for key in keys:
                line = self._encode({"op": "release", "key": key, "noreply": True,
                                     "id": self._next_id()})
                out.append(line)
                size += len(line)
                if size >= P.MAX_LINE:
                    self._send(b"".join(out))
                    out, size = [], 0
            if out:
                self._send(b"".join(out))
        finally:
            self._busy.release()

    def touch(self, key, readers, *, noreply=False):
        """Add readers awaited reads to a committed object: it cannot be
        evicted until that many more gets have happened."""
        req = {"op": "touch", "key": check_key(key), "readers": readers}
        if noreply:
            self._send_noreply(req)
        else:
            self._call(req)

    def delete(self, key, *, noreply=False):
        """Remove a committed object's key at once; pinned bytes stay valid
        for their pin holders until they release."""
        req = {"op": "delete", "key": check_key(key)}
        if not noreply:
            self._call(req)
            return
        self._enter()
        try:
            self._send_noreply_held(req)
            # Until a reply proves it handled, this client's read() of the
            # key asks the daemon (the catalog may still list the object).
            self._deleting_sent(req["key"])
        finally:
            self._busy.release()

    def fetch(self, peer, key):
        """Bring key from another host into this daemon's pool, through the
        local shmbroker-relay, which asks the relay it names peer; returns the
        object's size once it is committed here under key (get it then as any
        object). Fetches of one key at once share one transfer."""
        from . import _fetch
        return _fetch.fetch(self, peer, check_key(key))

    def contains(self, key):
        """Whether a committed object has this key (also ``key in client``)."""
        return self._call({"op": "contains", "key": check_key(key)})["exists"] is True

    def __contains__(self, key):
        return self.contains(key)

    def list(self, prefix="", limit=1000):
        """Objects whose key starts with prefix, oldest first, at most limit:
        an ObjectList of dicts (key, offset, size, pins, readers, state,
        age_ms) with ``.truncated``."""
        req = {"op": "list", "limit": limit}
        if isinstance(prefix, (bytes, bytearray)):
            try:
                prefix = bytes(prefix).decode("utf-8")
            except UnicodeDecodeError as e:
                raise InvalidRequest("EINVAL", "The prefix is not valid UTF-8 (byte 0x%02x at "
                                     "offset %d); keys are UTF-8 text." % (prefix[e.start],
                                                                          e.start)) from None
        if prefix:
            req["prefix"] = prefix
        # The daemon looks at a bounded number of objects per request and
        # says where to go on ("next"): ask again from there until limit
        # objects are listed or the pool has been looked through.
        objects = []
        while True:
            reply = self._call(req)
            objects.extend(_reply_list(reply, "objects", []))
            nxt = reply.get("next")
            if not isinstance(nxt, int) or nxt <= 0 or len(objects) >= limit:
                return ObjectList(objects, reply.get("truncated") is True)
            if nxt <= req.get("from", 0):
                raise ProtocolError("EPROTO", "shmbrokerd's list reply goes on from %d, not "
                                    "past %d where this request started." % (nxt, req.get("from", 0)))
            req["from"] = nxt
            req["limit"] = limit - len(objects)

    def stats(self, *, seats=False):
        """The daemon's stats: a dict with the fields of proto/stats.def
        (used, free, objects, pinned, blocker, counters...) of this client's
        pool, and from a daemon with pools, "pool" (its name) and "pools"
        (every pool's dict of the same fields, with "pool", "backing" and
        "group"), and "queues" as queue_list(seats=seats) returns them. The
        blocker's key of a pool whose group= leaves this client out is
        None."""
        reply = self._call({"op": "stats", "seats": True} if seats else {"op": "stats"})
        reply.pop("ok", None)
        reply.pop("id", None)
        return reply

    def queue_list(self, *, seats=False):
        """Every broadcast queue of every pool, in creation order: a list of
        dicts (PROTOCOL.md, queue_list), each a summary whose size does not
        grow with the queue's seats; with seats=True each has "seat_list",
        one dict per seat. The names (the queue's, its members') of a pool
        whose group= leaves this client out are None."""
        req = {"op": "queue_list", "seats": True} if seats else {"op": "queue_list"}
        return _reply_list(self._call(req), "queues")

    def clients(self):
        """Every open connection, newest first: a list of dicts (pid, uid,
        gid, name, mode, pins, pending, bytes_pinned, connected_unix, self,
        and from a daemon with pools, pool). The name of a connection whose
        pool has a group= that leaves this client out is None."""
        return _reply_list(self._call({"op": "clients"}), "clients")


    # ---- many objects ------------------------------------------------------


    def get_many(self, keys):
        """Pin many objects in as few round trips as the protocol allows
        (batch lines of at most 4096 gets and 64 KiB). Returns a list with,
        for each key, a Pin or the ShmBrokerError of that key (not raised).
        Every key is checked before anything is sent."""
        keys = _check_keys(_key_list(keys))
        elems = [b'{"op":"get","key":%s}' % json.dumps(k, ensure_ascii=False).encode()
                 for k in keys]
        out = []
        start = 0
        while start < len(elems):
            n = self._fill(elems, start, P.MAX_BATCH)
            replies = self._batch(elems[start:start + n])
            for key, r in zip(keys[start:start + n], replies):
                if isinstance(r, dict) and r.get("ok") is True:
                    try:
                        off, size = self._extent(r)
                    except ProtocolError as e:
                        self.release_later(key)
                        out.append(e)
                        continue
                    out.append(Pin(self, key, off, size, self._mv[off:off + size].toreadonly()))
                else:
                    out.append(_reply_error(r))
            start += n
        return out

    def put_many(self, items, *, readers=0):
        """Store many objects: items is an iterable of (key, data) with data
        as put() takes it. Returns a list with, for each item, the payload
        offset or the ShmBrokerError of that key (not raised).

        Sent as the C library does: batch lines of at most 1024 allocations
        (the daemon's default --max-pending) and 64 KiB, written, then
        committed in batch lines, before the next allocations; allocations
        refused with QuotaExceeded after others of the same line succeeded
        go again in the next line. Every key is checked before anything is
        sent. A lost connection raises ConnectionLost; the objects of the
        lines committed before it stay."""
        items = list(items)
        keys = _check_keys([k for k, _ in items])
        parts = []
        sizes = []
        for _, data in items:
            part, size = _prepare(data)
            parts.append(part)
            sizes.append(size)
        if type(readers) is not int:
            raise TypeError("readers is an int, not %s." % type(readers).__name__)
        _check_values([readers])
        extra = b',"readers":%d' % readers if readers else b""
        elems = [b'{"op":"alloc","key":%s,"size":%d%s}'
                 % (json.dumps(k, ensure_ascii=False).encode(), s, extra)
                 for k, s in zip(keys, sizes)]
        results = [None] * len(items)
        limit = P.PUT_CHUNK
        start = 0
        while start < len(elems):
            n = self._fill(elems, start, limit)
            replies = self._batch(elems[start:start + n])
            done = []  # (index, commit?) in order
            for i, r in enumerate(replies, start):
                if not (isinstance(r, dict) and r.get("ok") is True):
                    results[i] = _reply_error(r)
                    continue
                try:
                    off, _ = self._extent(r, sizes[i])
                except ProtocolError as e:
                    results[i] = e
                    done.append((i, False))
                    continue
                view = self._mv[off:off + sizes[i]]
                _write(view, parts[i])
                _release_view(view)
                results[i] = off
                done.append((i, True))
            self._commit_many(keys, done, results)
            end = start + n
            if done:
                # A cap (--max-pending) stopped the line part way: what was
                # allocated is committed now, so the rest goes again.
                for i in range(start, end):
                    if isinstance(results[i], ShmBrokerError) and results[i].code == "EDQUOT":
                        if i > start:
                            for j in range(i, end):
                                results[j] = None
                            end = i
                            limit = len(done)
                        break
            start = end
        return results

    def _commit_many(self, keys, done, results):
        elems = [b'{"op":"%s","key":%s}' % (b"commit" if ok else b"abort",
                                            json.dumps(keys[i], ensure_ascii=False).encode())
                 for i, ok in done]
        start = 0
        while start < len(elems):
            n = self._fill(elems, start, P.PUT_CHUNK)
            replies = self._batch(elems[start:start + n])
            for (i, ok), r in zip(done[start:start + n], replies):
                if ok and not (isinstance(r, dict) and r.get("ok") is True):
                    results[i] = _reply_error(r)
            start += n
