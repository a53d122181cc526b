# SPDX-License-Identifier: Apache-2.0
"""A drop-in for vLLM's shared-memory object store, over shmbrokerd.

vLLM's ``SingleWriterShmObjectStorage`` (vllm/distributed/device_communicators/
shm_object_storage.py) keeps objects in a ring of shared memory that one
writer process manages, readers counting their reads in flags of the ring.
``ShmBrokerObjectStorage`` has the same constructor, methods, attributes and
error texts, with shmbrokerd managing the memory:

- ``(address, monotonic_id)`` count from the store's first object, as
  vLLM's count from its ring's start: the first put of a new store, and the
  first after clear(), is (0, 0). The base is the offset and chunk id of
  that object, kept in a small object of the daemon that readers read from
  the segment's catalog; the chunk header before the payload holds the
  chunk id and key, so that a reader finds the object from the pair alone.
- An object awaits ``n_readers`` reads each time it is handed out (put,
  get_cached, the writer's touch); the daemon counts them (``readers`` of
  alloc, ``touch``) and evicts, oldest first, only objects whose awaited
  reads are all done.
- The hot path waits for no reply: a put copies the payload into the
  writer's arena (Client.put_nowait's path) and sends its commit without
  waiting; a get reads the chunk in place from the mapping, checked by the
  chunk's seal (its generation) before and after deserializing it, and
  counts the awaited read in the seal, a compare-and-swap in the reader's
  mapping: no request at all. Only a get whose chunk is not committed yet
  (its commit still on its way) or changed under the read asks the daemon:
  one request, then the pinned read of before.
- Readers map the segment read-write, as vLLM's readers map its ring (they
  write its in-use flags): the count in the seal needs it. What a reader
  could scribble there it could scribble in vLLM's ring too: counts that
  let an object go early (its readers get ValueError), never another
  object's bytes (a get checks the generation before and after). A reader
  told to connect read-only
  (``read_only=True`` on its ring, or $SHMBROKER_VLLM_READ_ONLY=1 in its
  environment, for readers made from a handle) counts each read by a
  request it does not wait for instead. The seal's compare-and-swap needs
  no lock: ``reader_lock`` is accepted (vLLM passes one) and ignored by
  readers, and a reader made without one works (vLLM raises "Lock must be
  provided for readers."). A writer given a lock counts its own gets as
  reads, as vLLM's does; without one they count nothing. A reader killed
  mid-read holds no pin; the object keeps the read it awaits, as vLLM's
  in-use flag keeps it.
- A key the writer holds is refused at once (its index, checked in the
  mapping), and so is one another client committed (the segment's
  catalog). Another client's commit of the key that lands between that
  look and the writer's own makes the daemon refuse the writer's: a later
  reply reports it, and the writer forgets that object before its next
  put (a reader's get of its pair raises vLLM's ValueError).
- Monotonic ids carry the payload's distance from the base (in 64-byte
  units, negative before it) beside the chunk id counted from the base:
  the objects of one arena share its chunk id. Ids grow put after put, and
  no two objects stored at once share one.
- Any number of writers may share one daemon (and one ring name); keys are
  the daemon's, so two writers cannot store the same key at once.
- What a writer leaves: close() deletes its objects; on a daemon it did not
  start, a guard process deletes them when the writer dies without close()
  (SIGKILL included), so that none stays awaiting reads and blocks other
  clients' reclaim. A private daemon stops with its writer.
- A store survives what a connection can lose: after a daemon restart or an
  interrupted call its next call reconnects once and goes on, and a store
  inherited across fork() makes a connection of its own in the child.
- The default serde is pickle: reading an object runs code its bytes name.
  Any read-write client of the daemon can write any byte of the segment, so
  use it only among processes that trust each other (the same user, a
  socket of mode 0600 or --allow-uid), as with vLLM's own store.

``SingleWriterShmRingBuffer`` stands in for vLLM's ring: the writer side uses
the daemon at $SHMBROKER_SOCKET (or the default socket) when one answers, else
starts a private shmbrokerd of ``data_buffer_size`` and stops it on close();
readers attach by name or through ``handle()``. It also has vLLM's ring
interface (allocate_buf, access_buf, free_buf, metadata, shared_memory), each
allocation an object of the daemon. Switching is one import:

    from shmbroker.vllm import (ShmBrokerObjectStorage as SingleWriterShmObjectStorage,
                                SingleWriterShmRingBuffer)

This module knows vLLM's interface and maps it onto shmbroker.Client; the
wire and the frames layout are the Client's and frames.py's.

The store's constructor, put, get and their kin are here; its other parts
are rooms of their own, their names importable from here: the serdes in
_vllm_serde.py, the ring in _vllm_ring.py, what the store knows of its
objects and of the base its pairs count from in _vllm_index.py (StoreIndex),
the guard process and how the store tells it in _vllm_guard.py
(GuardTelling).
"""

import collections
import dataclasses
import hashlib
import os
import time
from typing import Any, Tuple

from . import frames as _frames
from .client import check_key
from . import _protocol as P
from .errors import (Cancelled, ConnectionLost, KeyExists, NoSpace, NotFound, ObjectTooLarge,
                     ProtocolError, ShmBrokerError, Unsupported)
# The drop-in's rooms: the serdes, the ring, the store's index of its
# objects and base, the guard. Their names users and tests import stay
# importable from here.
from ._vllm_serde import ObjectSerde, PickleSerde, _OOB_STREAMS  # noqa: F401
from ._vllm_ring import (SingleWriterShmRingBuffer, named_socket_path,  # noqa: F401
                         _MAX_CHUNK_HEADER, _LIST_LIMIT)
from ._vllm_index import StoreIndex, _NO_BASE
from ._vllm_guard import GuardTelling, _guard_main  # noqa: F401

# The public names moved to those rooms keep the home users know them by:
# in their repr, in the path pickle records (a handle's serde_class), in
# what the vLLM plugin reports having switched.
for _public in (ObjectSerde, PickleSerde, SingleWriterShmRingBuffer, named_socket_path):
    _public.__module__ = __name__
del _public

__all__ = ["ObjectSerde", "PickleSerde", "ShmObjectStorageHandle", "ShmBrokerObjectStorage",
           "SingleWriterShmObjectStorage", "SingleWriterShmRingBuffer", "named_socket_path"]

# How long a get whose object is not committed in the mapping yet looks
# again before it asks the daemon (seconds): the writer's put sent its
# commit without waiting, and the daemon handles it within microseconds.
# Each look follows a sched_yield(), which lets the daemon run at once when
# it waits for this CPU (time.sleep(0) sleeps for the timer's slack, 50 us
# and more, each time). Past it, the daemon is slow to run (a loaded
# machine): a request waited for, which costs no CPU meanwhile, is answered
# once it ran, and the get looks again.
_LANDING_S = 0.0003
# How long, after a request answered by the daemon, a get still looks for
# a chunk whose header is not there yet (none, or an older chunk's): a
# commit on its way while the daemon is slow to run (a loaded machine).
# Only a pair naming nothing that was ever there waits it out.
_FLIGHT_S = 0.25
# vLLM's in-use flag before each object, counted in its size checks.
_FLAG_BYTES = 4
# (address, monotonic_id) pairs a reader remembers having read, for touch.
_SEEN_MAX = 1 << 16
# What _get_mapped returns when the mapping cannot say.
_MISSED = object()


@dataclasses.dataclass
class ShmObjectStorageHandle:
    """What create_from_handle() needs to open the store in another process
    (vLLM's ShmObjectStorageHandle): picklable when serde_class is a
    module-level class and reader_lock is None (a multiprocessing lock
    travels only as a Process argument)."""

    max_object_size: int
    n_readers: int
    ring_buffer_handle: tuple
    serde_class: type
    reader_lock: Any


class ShmBrokerObjectStorage(StoreIndex, GuardTelling):
    """vLLM's SingleWriterShmObjectStorage over shmbrokerd: same constructor,
    methods, attributes and error texts (see the module's help for what
    differs underneath).

    ``ShmBrokerObjectStorage(max_object_size, n_readers, ring_buffer,
    serde_class=PickleSerde, reader_lock=None)``. The writer is the store
    whose ring was made with create=True; the others are readers.

    Writer: put(key, value) -> (address, monotonic_id); is_cached(key);
    get_cached(key); touch(key); clear(); free_unused(). Everyone: get(address,
    monotonic_id); handle(); close(). Readers: touch(key, address,
    monotonic_id).

    Addresses and ids are relative to the store (its ring: the ring's name,
    or an unnamed ring's own id, which handle() passes), as vLLM's
    are to its ring: the first object put after the store starts or after
    clear() is (0, 0), on a private daemon or a shared one. The base they are
    counted from is a small object of the daemon (key
    "shmbroker-vllm-base:..."), which the writer puts back when it was
    evicted and readers read from the segment's catalog, without a round trip.

    Attributes: ``max_object_size``, ``n_readers``, ``ring_buffer``,
    ``serde_class``, ``ser_de``, ``is_writer``, and on the writer
    ``key_index`` (key -> (address, monotonic_id)) and ``id_index``
    (monotonic_id -> key), kept as vLLM's: put adds to them, and objects the
    daemon evicted are dropped from them by the first put after their
    eviction and whenever is_cached finds one gone.
    """

    # Whether the guard of a writer killed without close() leaves the objects
    # readers pin or await (SharedShmObjectStorage's other writers hand them out).
    _guard_keeps_awaited = False
    # Whether a put waits for its commit's reply (SharedShmObjectStorage's
    # does: another writer's object of the key is handed out on EEXIST).
    _put_waits = False

    def __init__(self, max_object_size: int, n_readers: int,
                 ring_buffer: SingleWriterShmRingBuffer, serde_class: type = PickleSerde,
                 reader_lock: Any = None):
        self.max_object_size = max_object_size
        self.n_readers = n_readers
        self.serde_class = serde_class
        self.ser_de = serde_class()
        self.ring_buffer = ring_buffer
        self.is_writer = ring_buffer.is_writer
        # Readers count reads by a compare-and-swap of the seal, so no reader
        # needs it; a writer given one counts its own gets, as vLLM's.
        self._reader_lock = reader_lock
        self.key_index = {}
        self.id_index = {}
        self._objects = {}  # key -> (segment offset, chunk id), oldest first
        # key -> (client, its replies read) when its commit was sent without
        # waiting: a reply read since on that connection proves it handled.
        self._sent = {}
        # (offset, chunk id) -> its key in _objects (a reused id found at once; the
        # objects of one arena share its chunk id)
        self._chunk_keys = {}
        self._seen = collections.OrderedDict()
        self._base = None  # (offset, chunk id, nonce) the pairs count from
        self._base_key = "shmbroker-vllm-base:%s" % hashlib.sha1(
            str(ring_buffer.ring_id).encode("utf-8", "surrogatepass")).hexdigest()[:24]
        self._guard = None
        # An unnamed ring's base is this store's alone (no other writer has
        # its id): close() and the guard delete it with the objects.
        self._own_base = ring_buffer.ring_id != ring_buffer.name
        self._base_where = None  # (offset, chunk id) of that base object
        # (client, its connection's generation, the base's chunk as
        # _mapped() gives it, the base) once read from the catalog.
        self._base_seen = None
        # (data area's size, _id_shift() of it), computed once per size.
        self._shift = (None, 0)
        # (client, the ring's start) when a put last pruned: see
        # _prune_reclaimed.
        self._reclaim_seen = None

    # ---- helpers -----------------------------------------------------------

    @property
    def _client(self):
        return self.ring_buffer.connection()

    def _again(self, call, *args):
        """call(*args); when the connection was lost (the daemon restarted,
        an earlier call was interrupted), reconnect once and call again, as
        vLLM's store, which has no connection to lose, never fails so."""
        try:
            return call(*args)
        except ConnectionLost as e:
            if e.code == "ENOTCONN" and self.ring_buffer.client is None:
                raise  # closed
            self.ring_buffer.reconnect()
            return call(*args)

    # ---- the writer --------------------------------------------------------

    def put(self, key: str, value: Any) -> Tuple[int, int]:
        """Store value under key and return (address, monotonic_id), which a
        reader passes to get(). The object awaits n_readers reads before it
        may be evicted.

        Raises ValueError "Key '{key}' already exists in the storage." (a
        KeyExists), ValueError "Serialized object size (N bytes) exceeds max
        object size (M bytes)" (an ObjectTooLarge), MemoryError "Not enough
        space in the data buffer, try calling free_buf() to free up space"
        followed by the daemon's account of what blocks reclaim (a NoSpace).

        A key given as UTF-8 bytes is its text (str) from here on: in
        key_index and for the other methods, which take either."""
        if type(key) is not str:
            key = check_key(key)
        before = self._objects.get(key)
        try:
            return self._put(key, value)
        except ConnectionLost as e:
            if e.code == "ENOTCONN" and self.ring_buffer.client is None:
                raise  # closed
            self.ring_buffer.reconnect()
        # The connection went after this put's chunk was published and
        # recorded: when it landed, the put was made (another look would
        # find the key taken, by this very put).
        if self._objects.get(key, before) != before:
            with self.ring_buffer.lock:
                pair = self._index_made(key)
            if pair is not None:
                return pair
        return self._put(key, value)

    def _put(self, key: str, value: Any) -> Tuple[int, int]:
        assert self.is_writer, "Only the writer can put objects."
        # The writer's own objects are known here (its index, checked in the
        # mapping); another client's object of the key refuses the commit,
        # which the daemon reports with a later reply (see _put_through).
        if key in self._objects and self._is_cached(key):
            if key not in self.key_index:  # its put was cut short: see _keep_cut
                with self.ring_buffer.lock:
                    self._index_made(key)
            raise KeyExists("EEXIST", "Key '%s' already exists in the storage." % key)
        checked = None
        if not self._put_waits:
            # Another writer's object of the key, committed: from the
            # catalog (no round trip), else the daemon says. Under the
            # ring's lock: the writer's threads share one connection.
            checked = check_key(key)
            with self.ring_buffer.lock:
                listed = self._client._listed(checked)
                if listed is None:
                    listed = self._client.contains(key)
            if listed:
                raise KeyExists("EEXIST", "Key '%s' already exists in the storage." % key)
        data, _nbytes, metadata, _md_bytes = self.ser_de.serialize(value)
        pieces, size = _flat(data, metadata)
        # vLLM counts its 4-byte in-use flag in the object's size; so does the
        # check here (the payload has no flag: the daemon counts the reads).
        counted = _FLAG_BYTES + size
        with self.ring_buffer.lock:
            client = self._client
            limit = min(self.max_object_size, client.info.get("max_object_size", counted))
            if counted > limit:
                raise ObjectTooLarge("E2BIG", "Serialized object size (%d bytes) exceeds max "
                                     "object size (%d bytes)" % (counted, limit))
            self._start_guard()
            # The usual put: published in the arena held, with no guard to
            # tell first (a private daemon's store has none).
            client._published = None
            if checked is not None and self._guard is None:
                try:
                    where = client._publish_held(checked, pieces, max(size, 1),
                                                 self.n_readers, _write_pieces)
                    if where is not None:
                        return self._put_made(client, key, where, True)
                except BaseException:
                    self._keep_cut(client, key)
                    raise
            told = []

            def before_commit(offset, chunk_id):
                if chunk_id is None:
                    # Read while pending: nobody else can free or reuse the chunk.
                    header = self._header(offset)
                    if header is None:
                        raise ProtocolError("EPROTO", "No chunk header before offset %d, "
                                            "where shmbrokerd allocated '%s'." % (offset, key))
                    chunk_id = header[0]
                # Told before the commit: a writer killed right after it
                # leaves an object the guard knows of; killed before it, the
                # daemon drops the allocation (or the arena's unused bytes)
                # and the guard finds no committed object there.
                self._tell_guard("P", key, offset, chunk_id)
                told.append((offset, chunk_id))

            try:
                nowait = self._put_through(client, key, pieces, max(size, 1), before_commit)
            except KeyExists:
                raise KeyExists("EEXIST", "Key '%s' already exists in the storage." % key) \
                    from None
            except ObjectTooLarge:
                raise ObjectTooLarge("E2BIG", "Serialized object size (%d bytes) exceeds max "
                                     "object size (%d bytes)"
                                     % (counted, client.info.get("max_object_size", limit))) \
                    from None
            except NoSpace as e:
                self._prune()
                raise NoSpace("ENOSPC", "Not enough space in the data buffer, try calling "
                              "free_buf() to free up space: %s" % e.message) from None
            except BaseException:
                if told:
                    self._tell_guard("F", key)
                self._keep_cut(client, key)
                raise
            try:
                return self._put_made(client, key, told[-1], nowait)
            except BaseException:
                self._keep_cut(client, key)
                raise

    def _put_through(self, client, key, pieces, size, before_commit):
        """Put pieces (size bytes, one after the other) under key through the
        client's arena, its commit sent without waiting (unless _put_waits);
        True when it was. Puts sent so that the daemon refused them are
        forgotten first (the client reports them before the next put), then
        this one is made. Without an arena: alloc and commit."""
        for _ in range(2):
            try:
                where = client._put_arena(key, pieces, size, self.n_readers,
                                          not self._put_waits, _write_pieces, before_commit,
                                          publish=True)
                return not self._put_waits and where[1] is not None
            except Cancelled:
                self._reconcile()
            except Unsupported:
                client._put_arena(key, pieces, size, self.n_readers, False, _write_pieces,
                                  before_commit)
                return False
        client._put_arena(key, pieces, size, self.n_readers, False, _write_pieces,
                          before_commit)
        return False

    def is_cached(self, key: str) -> bool:
        """Whether the object of key is still stored: asks the daemon (an
        object it evicted is dropped from key_index here)."""
        return self._again(self._is_cached, key)

    def _is_cached(self, key: str) -> bool:
        if type(key) is not str:
            key = _store_key(key)
        if key not in self._objects:
            return False
        with self.ring_buffer.lock:
            if self._alive(key):
                return True
            self._forget(key)
            return False

    def get_cached(self, key: str) -> Tuple[int, int]:
        """(address, monotonic_id) of a stored object, handed out once more:
        it awaits n_readers more reads. KeyError when key is not stored
        (any more)."""
        return self._again(self._get_cached, key)

    def _get_cached(self, key: str) -> Tuple[int, int]:
        if type(key) is not str:
            key = _store_key(key)
        if key not in self._objects:
            raise KeyError(key)
        with self.ring_buffer.lock:
            if not self._alive(key):  # a commit refused: the key is another's
                self._forget(key)
                raise KeyError(key)
            try:
                self._client.touch(key, self.n_readers)
            except NotFound:
                self._forget(key)
                raise KeyError(key) from None
            # The pair handed out again must resolve: the base it counts
            # from is put back if reclaim took it, followed if it moved, and
            # set at this object when another writer's clear() left none.
            self._settle_base(*self._objects[key])
            pair = self.key_index.get(key)
            if pair is None:
                pair = self._index_made(key)
                if pair is None:
                    raise KeyError(key)
            return pair

    def free_unused(self) -> None:
        """Drop what the daemon evicted from key_index and id_index. The
        daemon reclaims space itself, oldest first, when an allocation needs
        it; objects that may go stay readable until then."""
        if self.is_writer:
            with self.ring_buffer.lock:
                self._again(self._prune)

    def default_is_free_check(self, id: int, buf: Any = None) -> bool:
        """vLLM's check of whether the writer's object of monotonic id may be
        freed: here, whether the daemon no longer holds it for a read (no
        pins, no awaited reads), or no longer has it. buf is not looked at:
        the daemon keeps the counts."""
        key = self.id_index.get(id)
        if key is None or key not in self._objects:
            return True
        with self.ring_buffer.lock:
            # list() matches a prefix: "item_1" lists "item_10" too.
            objects = self._again(self._client.list, key, _LIST_LIMIT)
        for obj in objects:
            if obj.get("key") == key:
                return obj.get("pins", 0) == 0 and obj.get("readers", 0) == 0
        return not objects.truncated  # not seen among as many: say it is in use

    def clear(self) -> None:
        """Delete every object of this writer, empty its indexes, and count
        addresses and ids from (0, 0) again at the next put (readers' pins
        keep what they read valid until they release it)."""
        if not self.is_writer:
            return
        with self.ring_buffer.lock:
            if self.ring_buffer.client is not None:
                self._again(self._delete_own)
                # The ring's other writers, and readers, learn that pairs
                # start again at the next put.
                self._again(self._publish_base, _NO_BASE, True)
            for key in list(self._objects):
                self._forget(key)
            self.key_index.clear()
            self.id_index.clear()
            self._base = None

    def _delete_base(self):
        try:
            self._client.delete(self._base_key)
        except NotFound:
            pass
        self._base_where = None

    def _settle_sent(self):
        """Wait until the commits sent without waiting are handled, so that
        the chunk headers in the mapping say which objects are there."""
        client = self._client
        if client._unconfirmed[0] > 0 or client._lost_puts[0] > 0:
            try:
                client.sync()
            except Cancelled:
                pass
        self._reconcile()

    def _delete_own(self):
        client = self._client
        self._settle_sent()
        for key, (offset, chunk_id) in list(self._objects.items()):
            if self._header(offset, committed=True) == (chunk_id, key):
                client.delete(key, noreply=True)

    # ---- everyone ----------------------------------------------------------

    def get(self, address: int, monotonic_id: int) -> Any:
        """The value stored at (address, monotonic_id), deserialized while
        pinned and released right after (the default serde copies, so nothing
        of the value points into shared memory).

        A reader's get counts as one of the reads the object awaits, and so
        does the writer's when it was given a reader_lock (as vLLM's writer
        with a lock counts its reads); without one the writer's counts
        nothing. ValueError "Data for address:id 'A:I' has been modified or
        is invalid." when no such object is there any more."""
        return self._again(self._get, address, monotonic_id)

    def _get(self, address: int, monotonic_id: int) -> Any:
        with self.ring_buffer.lock:
            client = self._client
            where = self._abs(address, monotonic_id, client)
            if where is None:
                raise self._invalid(address, monotonic_id)
            value = self._get_mapped(address, monotonic_id, where, client)
            if value is not _MISSED:
                return value
            # Not committed in the mapping yet (a put whose commit is on its
            # way), or changed under the read: a request answered by the
            # daemon after it, then the mapping once more (the commit
            # landed meanwhile, as it mostly has), then the pinned read.
            self._client.contains(self._base_key)
            deadline = time.monotonic() + _FLIGHT_S
            pause = 0.0005
            while self._in_flight(*where) and time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(2 * pause, 0.02)
            value = self._get_mapped(address, monotonic_id, where, client, landing=False)
            if value is not _MISSED:
                return value
            return self._get_pinned(address, monotonic_id)

    def _in_flight(self, offset, chunk_id):
        """Whether the chunk of chunk_id at offset may still be on its way:
        no chunk header ends at offset, or an older chunk's (the bytes of a
        lap before). A header of chunk_id or a newer one says it landed, or
        went."""
        mv = self._client._mv
        doff = self._client.info["data_offset"]
        for hsize in range(P.ALIGN, _MAX_CHUNK_HEADER + 1, P.ALIGN):
            at = offset - hsize
            if at < doff:
                break
            h = P.CHUNK_HEADER.unpack_from(mv, at)
            if (h[0] == P.CHUNK_MAGIC and h[3] == hsize
                    and P.align64(P.CHUNK_HEADER_SIZE + h[2]) == hsize):
                return h[5] < chunk_id
        return True

    def _get_mapped(self, address, monotonic_id, where, client=None, landing=True):
        """The value at where (offset, chunk id) read in place from the
        mapping, checked by the chunk's seal before and after deserializing
        it, its awaited read counted in the seal (or by a noreply request):
        no round trip. _MISSED when the mapping cannot say (not committed
        yet within _LANDING_S, or at once without landing; changed under
        the read): ask the daemon."""
        offset, chunk_id = where
        client = client or self._client
        found = self._mapped(offset, client)
        if found is None or found[2] != chunk_id:
            # The writer's put may have sent its commit a moment ago: the
            # daemon is about to run, often on this CPU (see _LANDING_S).
            deadline = time.monotonic() + _LANDING_S if landing else 0
            while time.monotonic() < deadline:
                os.sched_yield()
                found = self._mapped(offset, client)
                if found is not None and found[2] == chunk_id:
                    break
            else:
                return _MISSED
        chunk, seal, _chunk_id, size, raw, tag = found
        view = client._mv[offset:offset + size].toreadonly()
        try:
            value = self.ser_de.deserialize(view)
        except Exception:
            # Changed under the read, or the header's size scribbled: the
            # daemon's pin says where the payload ends (bytes that do not
            # deserialize raise there).
            return _MISSED
        finally:
            view.release()
        if not self._sealed(found, client):
            return _MISSED
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError:
            return _MISSED
        if tag > 0 and (not self.is_writer or self._reader_lock is not None):
            client._count_in_place(key, chunk, seal & 0xFFFFFFFF)
        if not self.is_writer:
            self._remember(address, monotonic_id)
        return value

    def _get_pinned(self, address: int, monotonic_id: int) -> Any:
        """get() through the daemon: the object pinned while it is read."""
        with self.ring_buffer.lock:
            client = self._client
            where = self._abs(address, monotonic_id)
            if where is None:
                raise self._invalid(address, monotonic_id)
            offset, chunk_id = where
            header = self._header(offset, committed=True)
            if header is None or header[0] != chunk_id:
                raise self._invalid(address, monotonic_id)
            key = header[1]
            try:
                if self.is_writer and self._reader_lock is None:
                    # One more awaited read first, so that the get takes that
                    # one and the object's count is left as it was.
                    client.touch(key, 1)
                # get, not read(): the pin's offset proves the object is the
                # one at address (read() says nothing of where it read), and
                # deserialize reads the pinned bytes in place, no extra copy.
                pin = client.get(key)
            except NotFound:
                raise self._invalid(address, monotonic_id) from None
            try:
                if pin.offset != offset or self._header(offset) != header:
                    raise self._invalid(address, monotonic_id)
                value = self.ser_de.deserialize(pin.view)
            finally:
                pin.release(noreply=True)
            if not self.is_writer:
                self._remember(address, monotonic_id)
        return value

    def _remember(self, address, monotonic_id):
        seen = self._seen
        seen[(address, monotonic_id)] = True
        seen.move_to_end((address, monotonic_id))
        while len(seen) > _SEEN_MAX:
            seen.popitem(last=False)

    def touch(self, key: str, address: int = 0, monotonic_id: int = 0) -> None:
        """Mark an object as handed out again (vLLM's touch).

        Writer: key's object awaits n_readers more reads (nothing when key is
        not stored). Reader: counts one read of (address, monotonic_id)
        without reading it, when this reader has read it before (a new
        object's first read is its get); vLLM checks a count shared by all
        readers instead, which readers running at different paces can miss."""
        return self._again(self._touch, key, address, monotonic_id)

    def _touch(self, key: str, address: int = 0, monotonic_id: int = 0) -> None:
        with self.ring_buffer.lock:
            if self.is_writer:
                if type(key) is not str:
                    key = _store_key(key)
                if key not in self._objects:
                    return None
                if not self._alive(key):  # a commit refused: the key is another's
                    self._forget(key)
                    return None
                try:
                    self._client.touch(key, self.n_readers)
                except NotFound:
                    self._forget(key)
                return None
            if (address, monotonic_id) not in self._seen:
                return None
            where = self._abs(address, monotonic_id)
            header = self._header(where[0], committed=True) if where is not None else None
            if header is None or header[0] != where[1]:
                self._seen.pop((address, monotonic_id), None)
                return None
            try:
                pin = self._client.get(header[1])
            except NotFound:
                self._seen.pop((address, monotonic_id), None)
                return None
            pin.release(noreply=True)
        return None

    def close(self) -> None:
        """Close the store: a writer deletes the objects it stored first, so
        that none is left awaiting reads on a shared daemon (a reader still
        reading one keeps its bytes until it is done); then the ring closes
        (its connection, and the private daemon it started)."""
        try:
            self._let_go()
        finally:
            self.ring_buffer.close()

    def __del__(self):
        # A store dropped without close() lets go of its objects and its
        # guard, as vLLM's ring dropped frees its memory; the ring closes
        # itself when it goes too.
        try:
            self._let_go()
        except Exception:
            pass

    def _let_go(self):
        """A writer's objects deleted, and its guard stopped."""
        deleted = False
        try:
            if self.is_writer and self.ring_buffer.client is not None and \
                    os.getpid() == self.ring_buffer._owner:
                try:
                    with self.ring_buffer.lock:
                        self._again(self._delete_own)
                        if self._own_base:
                            self._again(self._delete_base)
                except ShmBrokerError:
                    pass  # the daemon is gone, and the objects with it
                deleted = True
        finally:
            # Else the guard deletes them; a shared store's _delete_own left
            # those readers await, which its guard deletes once read or past
            # its grace.
            self._stop_guard(clean=deleted and not self._guard_keeps_awaited)

    def handle(self) -> ShmObjectStorageHandle:
        """A handle for create_from_handle() in another process."""
        return ShmObjectStorageHandle(
            max_object_size=self.max_object_size,
            n_readers=self.n_readers,
            ring_buffer_handle=self.ring_buffer.handle(),
            serde_class=self.serde_class,
            reader_lock=self._reader_lock,
        )

    @staticmethod
    def create_from_handle(handle: ShmObjectStorageHandle) -> "ShmBrokerObjectStorage":
        """A reader of the store handle() described, in this process."""
        ring_buffer = SingleWriterShmRingBuffer(*handle.ring_buffer_handle)
        return ShmBrokerObjectStorage(
            max_object_size=handle.max_object_size,
            n_readers=handle.n_readers,
            ring_buffer=ring_buffer,
            serde_class=handle.serde_class,
            reader_lock=handle.reader_lock,
        )


def _store_key(key):
    """key as the store keeps it: UTF-8 bytes as their text, anything else
    as it is (a key that is no text names nothing stored: is_cached() says
    False, as vLLM's does, instead of raising)."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        try:
            return bytes(key).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(key)
    return key


def _flat(data, metadata):
    """A serde's (data, metadata) as flat byte views in the order they are
    written, and their size."""
    pieces = []
    size = 0
    for p in ([metadata] if metadata else []) + (data if isinstance(data, list) else [data]):
        p = _frames.as_bytes(p)
        pieces.append(p)
        size += p.nbytes
    return pieces, size


def _write_pieces(view, pieces):
    """Write a serde's pieces into view, one after the other."""
    pos = 0
    for p in pieces:
        view[pos:pos + p.nbytes] = p
        pos += p.nbytes


# vLLM's name, for code that imports it from here.
SingleWriterShmObjectStorage = ShmBrokerObjectStorage
