# SPDX-License-Identifier: Apache-2.0
"""What a store of the drop-in (shmbroker.vllm.ShmBrokerObjectStorage) knows
of its objects apart from putting and getting them: the chunks read from the
mapping, the writer's own objects and what became of their commits, and the
base that the store's (address, monotonic_id) pairs count from, with the
translation between those pairs and the daemon's (offset, chunk id).

ShmBrokerObjectStorage inherits StoreIndex; the state stays on the store
(key_index, id_index, _objects, _sent, _chunk_keys, _base, _base_key,
_base_seen, _shift), and _client, _tell_guard and _settle_sent are the
store's. This module knows the mapping's chunk headers and seals, nothing of
serdes or of the guard process.
"""

import os
import struct

from . import _protocol as P
from .errors import KeyExists, NoSpace, NotFound, ProtocolError
from ._vllm_ring import _MAX_CHUNK_HEADER

# The base of a store's addresses and ids in the daemon: offset, chunk id, nonce.
_BASE = struct.Struct("<QQQ")
# The base after a clear(): none until the next put sets it (a nonce is never 0).
_NO_BASE = (0, 0, 0)
# The segment header's ring_start: where the ring's oldest chunk is.
_RING_START = struct.Struct("=Q")
_RING_START_AT = dict(P.SEGMENT_HEADER_FIELDS)["ring_start"]
# Puts after which a put prunes even though the ring's start did not move
# (_prune_reclaimed): a bound on what the index holds of objects that went.
_PRUNE_EVERY = 64


class StoreIndex:
    """The store's chunks, objects and base (see the module's help)."""

    @staticmethod
    def _invalid(address, monotonic_id):
        return ValueError("Data for address:id '%s:%s' has been modified or is invalid."
                          % (address, monotonic_id))

    def _header(self, address, committed=False):
        """(chunk_id, key) of the chunk at address, or None when there is no
        chunk header there (with committed, none of a committed object: a
        deleted object's header stays until its space is reused, and a read
        must not count against a newer object of the same key)."""
        try:
            return self._client.object_header(address, committed=committed)
        except (ProtocolError, TypeError, ValueError):
            return None

    def _mapped(self, offset, client=None):
        """The chunk whose payload starts at offset, read from the mapping
        with no round trip: (chunk, seal, chunk id, payload size, key
        bytes, tag) of a committed, sealed chunk (generation not 0), else
        None. Nothing is trusted: the header must be whole and inside the
        data area; the caller compares the seal again after using the
        bytes (the daemon zeroes the generation before it reuses them)."""
        client = client or self._client
        info = client.info
        mv = client._mv
        doff = info["data_offset"]
        dend = doff + info["data_size"]
        if type(offset) is not int or offset % P.ALIGN or offset <= doff or offset > dend:
            return None
        for hsize in range(P.ALIGN, _MAX_CHUNK_HEADER + 1, P.ALIGN):
            chunk = offset - hsize
            if chunk < doff:
                return None
            magic, state, key_len, header_size, tag, chunk_id, _cs, size, seal = \
                P.CHUNK_HEADER.unpack_from(mv, chunk)
            if magic != P.CHUNK_MAGIC or header_size != hsize:
                continue
            if ((state != P.CHUNK_COMMITTED and state != P.CHUNK_WRITTEN)
                    or seal & 0xFFFFFFFF == 0 or key_len > P.KEY_MAX
                    or P.align64(P.CHUNK_HEADER_SIZE + key_len) != hsize
                    or size > dend - offset):
                return None
            key = mv[chunk + P.CHUNK_HEADER_SIZE:chunk + P.CHUNK_HEADER_SIZE + key_len].tobytes()
            return chunk, seal, chunk_id, size, key, tag
        return None

    def _sealed(self, found, client=None):
        """Whether the chunk _mapped() found still has its generation and key."""
        chunk, seal, _chunk_id, _size, key, _tag = found
        mv = (client or self._client)._mv
        now = P.CHUNK_HEADER.unpack_from(mv, chunk)
        return ((now[8] ^ seal) & 0xFFFFFFFF == 0
                and (now[1] == P.CHUNK_COMMITTED or now[1] == P.CHUNK_WRITTEN)
                and mv[chunk + P.CHUNK_HEADER_SIZE:chunk + P.CHUNK_HEADER_SIZE + len(key)]
                == key)

    def _unconfirmed(self, key):
        """Whether key's commit was sent without waiting and no reply since
        proves it handled."""
        sent = self._sent.get(key)
        if sent is None:
            return False
        client = self._client
        # Another connection (a reconnect, a child after fork()) cannot
        # confirm it: the mapping says.
        if sent[0] is not client or client._replies > sent[1]:
            del self._sent[key]
            return False
        return True

    def _alive(self, key):
        """Whether the writer's object of key is still stored, from the
        mapping (no round trip): its chunk committed and sealed with its
        chunk id and key, or its commit still on its way."""
        where = self._objects.get(key)
        if where is None:
            return False
        raw = key.encode("utf-8", "surrogatepass")
        client = self.ring_buffer.client
        found = self._mapped(where[0], client)
        if found is not None and found[2] == where[1] and found[4] == raw:
            # Committed; or published (not folded yet) and either folded
            # since (a reply came after the put) or the fold will take it.
            if (P.CHUNK_HEADER.unpack_from(client._mv, found[0])[1] == P.CHUNK_COMMITTED
                    or not self._unconfirmed(key)):
                return True
        elif not self._unconfirmed(key):
            return False
        # On its way: it lands unless another client's object of the key
        # (listed in the catalog) makes the daemon refuse it. Then, or when
        # the catalog cannot say (the daemon listing this one just now), the
        # daemon's reply tells (a round trip); handing the pair out meanwhile
        # would name nothing, and touching the key would add reads to the
        # other client's object.
        if self._client._listed(key) is False:
            return True
        found = self._mapped(where[0], client)
        if (found is not None and found[2] == where[1] and found[4] == raw
                and P.CHUNK_HEADER.unpack_from(client._mv, found[0])[1] == P.CHUNK_COMMITTED):
            return True
        self._settle_sent()  # forgets key when its commit was refused
        return key in self._objects

    def _keep_cut(self, client, key):
        """A put of key cut short (any exception, KeyboardInterrupt and a
        lost connection included) after its chunk was published: its object
        is recorded as the writer's, so that is_cached() and get_cached()
        find it, a put of the key is refused as for any stored key and
        close() deletes it (else it would stay, unknown to the writer,
        awaiting reads no reader is told of). key_index gets it when next
        asked (_index_made); a chunk the daemon does not take is forgotten
        as any refused put."""
        made = getattr(client, "_published", None)
        if made is None or made[0] != key:
            return
        where = made[1:]
        client._published = None
        if self._objects.get(key) == where:
            return
        old = self._chunk_keys.get(where)
        if old is not None and old != key:
            self._forget(old)
        self._objects[key] = where
        self._chunk_keys[where] = key
        self._sent[key] = (client, client._replies)

    def _index_made(self, key):
        """The writer's object of key, recorded but maybe not in key_index
        (its put cut short, _keep_cut): (address, monotonic_id), now in
        key_index and id_index, or None when it is not stored (forgotten).
        Called holding the ring's lock."""
        where = self._objects.get(key)
        if where is None or not self._alive(key):
            self._forget(key)
            return None
        client = self._client
        self._settle_base(where[0], where[1], client)
        pair = self.key_index.get(key)
        if pair is None:
            pair = self._rel(where[0], where[1], client)
            self.key_index[key] = pair
            self.id_index[pair[1]] = key
        return pair

    def _put_made(self, client, key, where, nowait):
        """Record the writer's object of key put at where (offset, chunk
        id), its commit sent without waiting (nowait) or answered, and
        return its (address, monotonic_id). Called holding the ring's lock."""
        offset, chunk_id = where
        arena = client._arena
        if arena.size and arena.chunk_id < chunk_id:
            # This put went around the arena (an object too large for
            # one) and has a newer chunk id: the next put into the arena
            # would get a smaller monotonic id than this one. The next
            # put asks for a new arena (the daemon takes this one back).
            arena.drop()
        old = self._chunk_keys.get((offset, chunk_id))
        if old is not None and old != key:
            self._forget(old)  # an id the daemon gave back and reused
        prev = self._objects.get(key)
        if prev is not None and self._chunk_keys.get(prev) == key:
            del self._chunk_keys[prev]
        self._objects[key] = (offset, chunk_id)
        if nowait:
            self._sent[key] = (client, client._replies)
        self._chunk_keys[(offset, chunk_id)] = key
        self._settle_base(offset, chunk_id, client)
        address, monotonic_id = self._rel(offset, chunk_id, client)
        self.key_index[key] = (address, monotonic_id)
        self.id_index[monotonic_id] = key
        self._prune_reclaimed(client)
        return address, monotonic_id

    def _reconcile(self):
        """After the daemon reported puts sent without waiting as refused
        (or maybe lost with a connection): forget those of this writer's
        objects whose commit did not land. Every commit sent before the
        report is handled by now."""
        for key in list(self._sent):
            self._sent.pop(key, None)
            if key in self._objects and not self._alive(key):
                self._forget(key)

    # ---- the base of addresses and ids -------------------------------------

    def _read_base(self, client=None):
        """The base the ring's pairs count from, as the daemon holds it:
        (offset, chunk id, nonce), _NO_BASE after a clear() (the next put
        sets it), or None when there is none (a new ring, or evicted).

        Once read from the catalog, the base object's chunk is remembered:
        while its seal keeps the generation and the key (a committed
        object's bytes never change; a deleted or evicted one's generation
        is zeroed first), the base is the one read, and each put and get
        looks at one header instead of the catalog. client: the ring's
        connection, when the caller has it."""
        client = client or self._client
        seen = self._base_seen
        if (seen is not None and seen[0] is client and seen[1] == client._gen
                and self._sealed(seen[2], client)):
            return seen[3]
        self._base_seen = None
        try:
            where = client._read_at(self._base_key)
            raw = where[0] if where is not None else client.read(self._base_key)
        except NotFound:
            return None
        if len(raw) != _BASE.size:
            return None
        base = _BASE.unpack(raw)
        if where is not None:
            found = (where[1], where[2], 0, 0, self._base_key.encode("ascii"), 0)
            self._base_seen = (client, client._gen, found, base)
        return base

    def _current_base(self, client=None):
        """The base to resolve a pair with: the daemon's, else the last one
        seen (the daemon's was evicted and not put back yet); None when a
        clear() left none."""
        base = self._read_base(client)
        if base == _NO_BASE:
            return None
        if base is not None and base != self._base:
            self._base = base
            self._rekey()
        return self._base

    def _publish_base(self, base, replace=False):
        """Put base as the ring's (with replace, in place of the one there);
        when another writer's is there already, that one is the ring's and
        is returned instead."""
        client = self._client
        try:
            if replace:
                try:
                    client.delete(self._base_key)
                except NotFound:
                    pass
            offset = client.put(self._base_key, _BASE.pack(*base))
            if self._own_base and self.is_writer:
                header = self._header(offset, committed=True)
                if header is not None:
                    self._base_where = (offset, header[0])
                    self._tell_guard("P", self._base_key, offset, header[0])
        except KeyExists:
            theirs = self._read_base()
            if theirs is not None:
                return theirs
        except NoSpace:
            pass  # readers use the last base they saw; the next put tries again
        return base

    def _settle_base(self, offset, chunk_id, client=None):
        """After a put at (offset, chunk_id), or before a get_cached of that
        object: make sure the daemon holds the base (this object's position
        when there is none yet, or a clear() left none), and adopt another
        writer's base when it changed."""
        base = self._read_base(client)
        if base is None or base == _NO_BASE:
            if base == _NO_BASE or self._base is None:
                ours = (offset, chunk_id, int.from_bytes(os.urandom(8), "little") or 1)
            else:
                ours = self._base  # evicted: put back
            base = self._publish_base(ours, replace=base == _NO_BASE)
        if base != self._base:
            self._base = base
            self._rekey()

    def _id_shift(self, client=None):
        """The bits of a monotonic id below its chunk id's part: enough for
        a payload's place in the data area in 64-byte units. The objects of
        one arena share its chunk id; their places tell them apart."""
        size = (client or self.ring_buffer.client).info["data_size"]
        shift = self._shift
        if shift[0] != size:
            shift = self._shift = (size, max(1, (size // P.ALIGN).bit_length()))
        return shift[1]

    def _rel(self, offset, chunk_id, client=None):
        """The store's (address, monotonic_id) of the object at (offset,
        chunk_id): the address counts from the base's offset; the id is the
        chunk id counted from the base's, times 2 << _id_shift(), plus the
        payload's distance from the base's in 64-byte units (negative before
        it), so that ids grow put after put, within an arena that the ring
        brought round across the base's place too, and no two objects
        stored at once share one."""
        client = client or self._client
        base_offset, base_id = self._base[0], self._base[1]
        address = (offset - base_offset) % client.info["data_size"]
        return address, (((chunk_id - base_id) << (self._id_shift(client) + 1))
                         + (offset - base_offset) // P.ALIGN)

    def _abs(self, address, monotonic_id, client=None):
        """(offset, chunk_id) of the store's pair, or None when it names nothing."""
        client = client or self._client
        base = self._current_base(client)
        info = client.info
        if (base is None or type(address) is not int or type(monotonic_id) is not int
                or not 0 <= address < info["data_size"] or address % P.ALIGN):
            return None
        doff = info["data_offset"]
        offset = doff + (base[0] - doff + address) % info["data_size"]
        # What is left of the id without the distance is the chunk id's part.
        part = monotonic_id - (offset - base[0]) // P.ALIGN
        shift = self._id_shift(client) + 1
        if part & ((1 << shift) - 1):
            return None
        return offset, base[1] + (part >> shift)

    def _rekey(self):
        """key_index and id_index again, counted from the current base."""
        self.key_index.clear()
        self.id_index.clear()
        if self._base is None:
            return
        for key, (offset, chunk_id) in self._objects.items():
            pair = self._rel(offset, chunk_id)
            self.key_index[key] = pair
            self.id_index[pair[1]] = key

    def _forget(self, key):
        self._sent.pop(key, None)
        entry = self._objects.pop(key, None)
        if entry is not None and self._chunk_keys.get(entry) == key:
            del self._chunk_keys[entry]
        pair = self.key_index.pop(key, None)
        if pair is not None and self.id_index.get(pair[1]) == key:
            del self.id_index[pair[1]]
        if entry is not None:
            self._tell_guard("F", key)

    def _prune_reclaimed(self, client):
        """_prune() after a put, when the daemon may have evicted anything
        since the last: only after the ring's start moved. Evictions take
        the oldest chunk, so every one moves the start, which the daemon
        mirrors into the segment header (ring_start) right after; an
        eviction caught between the two is pruned after the next put.

        The start alone is not trusted for long: it may come back to the
        same place (a lap of the ring between two puts, the ring emptied),
        another client's delete moves nothing, and any read-write client
        can write the word. Every _PRUNE_EVERY puts prune whatever it says,
        so that the index never holds more than that many puts' worth of
        objects that went."""
        start = _RING_START.unpack_from(client._mv, _RING_START_AT)[0]
        seen = self._reclaim_seen
        if seen is not None and seen[0] is client and seen[1] == start and seen[2] > 0:
            self._reclaim_seen = (client, start, seen[2] - 1)
            return
        self._reclaim_seen = (client, start, _PRUNE_EVERY)
        self._prune()

    def _prune(self):
        """Drop the objects the daemon evicted from key_index and id_index.
        Eviction goes oldest first, so this walks the writer's objects from
        the oldest and stops at the first that lives, looking at their chunks
        in the mapping (the daemon zeroes a chunk's generation before it
        reuses its bytes): no round trip."""
        while self._objects:
            key = next(iter(self._objects))
            if self._alive(key):
                return
            self._forget(key)
