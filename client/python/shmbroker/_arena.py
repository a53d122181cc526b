# SPDX-License-Identifier: Apache-2.0
"""Puts through an arena, as client/arena.c makes them (proto/PROTOCOL.md,
section 11): the connection holds a run of the ring the daemon granted it,
copies each payload there under the arena's lock and commits it with one
``commit_at``, which put_nowait() sends without waiting for its reply.

The rules are the C library's, in its order: the lock word (the arena
header's seal) goes T|IDLE -> T|BUSY before the copy and back after it; the
count of commits on their way (8 bytes at offset 48 of the arena's header)
goes up by one before the lock is IDLE again, so that the daemon never takes
the arena back under a commit that was sent; the next arena is asked for in
the same write as the commit that leaves the arena low. A commit sent
without waiting that the daemon refused is told by the next reply's
``"lost"``; the next put (or sync()) reports it and is not made.

This module knows the arena's layout and the order of its steps; the socket,
the reply's parsing and the errors' record are the Client's (client.py).
"""

from . import _protocol as P

__all__ = ["Arena", "MAX_OBJECTS", "SKIP", "INFLIGHT_AT", "PUBLISHED_AT", "PUBLISH_CLOSED",
           "IDLE", "BUSY", "REVOKED"]

# The lock in the two low bits of an arena's lock word (SHMB_ARENA_*).
IDLE = 0
BUSY = 1
REVOKED = 2
# Where an arena's header counts its commits on their way
# (SHMB_ARENA_INFLIGHT_AT).
INFLIGHT_AT = 48
# Where it holds the end of the chunks its client published
# (SHMB_ARENA_PUBLISHED_AT), and what the daemon leaves there when it closes
# the arena (SHMB_ARENA_PUBLISH_CLOSED).
PUBLISHED_AT = 56
PUBLISH_CLOSED = (1 << 64) - 1
# Chunks of the put's size an arena for published chunks has room for: its
# request is the only line a run of publishing puts sends.
PUBLISH_RUN = 128
# Objects one arena holds at most (SHMB_ARENA_MAX_OBJECTS): the commit of
# the last asks for the next arena.
MAX_OBJECTS = 8192
# Puts that go without an arena after the daemon had no room for one
# (CLIENT_ARENA_SKIP): each refused arena costs a round trip.
SKIP = 16
_M64 = (1 << 64) - 1


class Arena:
    """The arena one connection holds: where (offset, size), the grant's
    token, the next free byte (cursor), the objects laid out in it, the
    arena's chunk id (every object in it carries it), and whether arenas are
    off for this connection (off) or skipped for the next few puts (skip)."""

    __slots__ = ("offset", "size", "token", "cursor", "chunks", "chunk_id", "off", "skip",
                 "published", "gen")

    def __init__(self):
        self.offset = self.size = self.token = self.cursor = self.chunks = 0
        self.published = self.gen = 0
        self.chunk_id = 0
        self.off = False
        self.skip = 0

    def drop(self):
        """Hold no arena (the next put asks for one)."""
        self.size = 0

    def limit(self, info):
        """The largest arena the daemon grants, in which a chunk must fit:
        min(max_object_size, data_size / 8), whole 64-byte units, at most
        what the arena's 32-bit tag counts."""
        lim = min(info["data_size"] // 8, info["max_object_size"], 0xFFFFFFFF * P.ALIGN)
        return lim & ~(P.ALIGN - 1)

    def ask(self, info, chunk, want, run=4):
        """The size to ask for with a chunk of chunk bytes to lay out: room
        for run such chunks (four; PUBLISH_RUN for published ones, which
        send nothing until the next arena is asked for), at least want and
        one chunk of the longest key; no more than limit()."""
        ask = max(want, run * chunk, P.align64(P.CHUNK_HEADER_SIZE + P.KEY_MAX) + 64)
        return min(ask, self.limit(info))

    def take(self, reply, info, mv):
        """Hold what an arena reply granted; False (arenas off for this
        connection) when it lies outside the data area or has no token."""
        self.size = 0
        offset, size, token = (reply.get(k) for k in ("offset", "size", "token"))
        doff = info["data_offset"]
        end = doff + info["data_size"]
        if (not all(type(v) is int for v in (offset, size, token)) or offset % P.ALIGN
                or offset < doff + P.ALIGN or offset > end or size <= 0 or size > end - offset
                or token <= 0 or token & 3 or token > _M64):
            self.off = True
            return False
        self.offset = self.cursor = self.published = offset
        self.size = size
        self.token = token
        self.chunks = 0
        # The generations of the chunks it publishes: any but 0, new for
        # each (the daemon keeps the one a chunk was published under).
        self.gen = (token >> 2) & 0xFFFFFFFF
        # The arena's own header holds its chunk id, which the daemon gives
        # every object committed in it.
        self.chunk_id = P.CHUNK_HEADER.unpack_from(mv, offset - P.ALIGN)[5]
        return True

    def room(self, chunk):
        """Whether a chunk of chunk bytes fits at the cursor of the arena held."""
        return (self.size > 0 and chunk <= self.offset + self.size - self.cursor
                and self.chunks < MAX_OBJECTS)

    def refill(self, chunk):
        """Whether the commit of a chunk of chunk bytes at the cursor should
        ask for the next arena in the same write: less than one such chunk
        or a quarter of the arena left after it, or the arena's last object."""
        left = self.offset + self.size - (self.cursor + chunk)
        self.chunks += 1
        return left < chunk or left < self.size // 4 or self.chunks >= MAX_OBJECTS

    def lock_at(self):
        """The offset in the mapping of the arena's lock word."""
        return self.offset - P.ALIGN + P.SEAL_AT

    def inflight_at(self):
        """The offset in the mapping of the count of commits on their way."""
        return self.offset - P.ALIGN + INFLIGHT_AT

    def _lock(self, base, cas64):
        """Take the arena's lock (T|IDLE -> T|BUSY): (the lock word's
        address, its IDLE and BUSY words), or None when the arena was taken
        back (it is dropped: nothing more goes into it)."""
        lock = base + self.lock_at()
        idle = (self.token & ~3) | IDLE
        busy = (self.token & ~3) | BUSY
        if cas64(lock, idle, busy) != idle:
            self.size = 0
            return None
        return lock, idle, busy

    def write(self, base, cas64, hsize, part, size, view_of, write):
        """Copy part (size bytes, as _prepare gave it) to the cursor after a
        header of hsize bytes, holding the lock, and count the commit that
        follows before the lock goes IDLE. base: the mapping's address;
        view_of(offset, size): a writable view of the mapping. False when
        the arena was taken back (before, or under the copy): nothing of a
        later put goes into it then."""
        held = self._lock(base, cas64)
        if held is None:
            return False
        lock, idle, busy = held
        at = self.cursor + hsize
        try:
            write(view_of(at, size), part)
        except BaseException:
            cas64(lock, busy, idle)  # nothing counted: nothing to commit
            raise
        self.count(base, cas64, 1)
        if cas64(lock, busy, idle) != busy:
            self.size = 0
            return False
        return True

    def publish(self, base, cas64, mv, key_raw, hsize, part, size, readers, write):
        """Lay a chunk out at the cursor and publish it (PROTOCOL.md,
        section 11, "Publishing"): no commit_at. Holding the lock: the
        payload (part, size bytes, written by write(view, part)), then the
        header (state WRITTEN, the arena's chunk id, readers awaited, a
        generation of this arena's) and the key, then the arena's published
        end moved past the chunk with a compare-and-swap from where this
        client last left it. True when the chunk is published (the daemon
        folds it into a committed object); False when the arena was taken
        back before (nothing published: the caller lays the chunk out
        elsewhere). An arena taken back after is dropped."""
        held = self._lock(base, cas64)
        if held is None:
            return False
        lock, idle, busy = held
        at = self.cursor
        chunk = hsize + P.align64(size)
        gen = (self.gen + 1) & 0xFFFFFFFF or 1
        try:
            write(mv[at + hsize:at + hsize + size], part)
            P.CHUNK_HEADER.pack_into(mv, at, P.CHUNK_MAGIC, P.CHUNK_WRITTEN, len(key_raw), hsize,
                                     readers, self.chunk_id, chunk, size, gen)
            mv[at + P.CHUNK_HEADER_SIZE:at + P.CHUNK_HEADER_SIZE + len(key_raw)] = key_raw
        except BaseException:
            cas64(lock, busy, idle)  # nothing published
            raise
        pub = base + self.offset - P.ALIGN + PUBLISHED_AT
        done = False
        try:
            done = cas64(pub, self.published, at + chunk) == self.published
            if not done:
                # The end is not where this client left it (closed, or
                # moved by a scribbler): the chunk laid out above must not
                # be folded by an end moved past it, since the caller lays
                # it out again elsewhere (two objects of one put). Unsealed
                # while the lock is still held.
                P.CHUNK_HEADER.pack_into(mv, at, 0, P.CHUNK_FREE, 0, P.ALIGN, 0, 0, 0, 0, 0)
        finally:
            # Released whatever comes (an interrupt here would hold the
            # arena BUSY until the connection closes).
            if cas64(lock, busy, idle) != busy or not done:
                self.size = 0
        if done:
            self.gen = gen
            self.published = self.cursor = at + chunk
        return done

    def count(self, base, cas64, n):
        """Add n (+1 or -1) to the arena's count of commits on their way,
        never below 0 (a compare-and-swap: the daemon takes them off)."""
        at = base + self.inflight_at()
        for _ in range(1000):
            old = cas64(at, 0, 0)  # a read of the whole word, in one piece
            new = (old + n) & _M64 if n > 0 or old > 0 else 0
            if cas64(at, old, new) == old:
                return
