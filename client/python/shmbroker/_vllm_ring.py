# SPDX-License-Identifier: Apache-2.0
"""The ring of the store drop-in (shmbroker.vllm): SingleWriterShmRingBuffer,
which stands in for vLLM's ring over a shmbrokerd (shared, or a private one
it starts), its ``shared_memory`` (_RingMemory), and where a named ring's
private daemon listens (named_socket_path).

This module knows the daemon's Client and how a segment is laid out; it
knows nothing of the store's objects, addresses or ids, nor of its guard.
shmbroker.vllm re-exports its public names.
"""

import contextlib
import hashlib
import itertools
import os
import re
import tempfile
import threading
import uuid
import weakref
from typing import Callable, Iterable, Optional, Tuple

from .client import Client, default_socket_path
from .daemon import socket_answers, spawn_daemon
from .errors import (ConnectionLost, InvalidRequest, KeyExists, NoSpace, NotFound,
                     ObjectTooLarge, ShmBrokerError)

# The segment's header page, before the data area (proto/layout.h).
_HEADER_PAGE = 4096
# The largest chunk header, align64(48 + 255): what the daemon keeps free of
# the data area for one object's header (its --max-object-size bound).
_MAX_CHUNK_HEADER = 320
# Objects one list request asks for: enough to find a key among those it prefixes.
_LIST_LIMIT = 1000
# The share of the data area a writer's arena asks for (see _connect).
_ARENA_SHARE = 64
# Set (1) in a reader's environment: its rings connect read-only.
_READ_ONLY_ENV = "SHMBROKER_VLLM_READ_ONLY"
# This process's id, kept up to date in a child made by fork(): every call
# asks whether its connection is this process's, and os.getpid() is a
# system call each time.
_pid = [os.getpid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
# Ring names used as a socket file name as they are; others are hashed.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def named_socket_path(name):
    """The socket of the private daemon that a ring named name starts, so
    that readers opening the ring by name (as vLLM's workers do) find it: in
    a directory of this user's in the temporary directory. None when that
    directory belongs to someone else."""
    base = os.path.join(tempfile.gettempdir(), "shmbroker-%d" % os.getuid())
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    st = os.lstat(base)
    if not (os.path.isdir(base) and not os.path.islink(base) and st.st_uid == os.getuid()
            and (st.st_mode & 0o077) == 0):
        return None
    if not _SAFE_NAME.match(name):
        name = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return os.path.join(base, name + ".sock")


def _env_read_only():
    """Whether $SHMBROKER_VLLM_READ_ONLY asks readers to connect read-only
    (1, true, yes, on)."""
    return os.environ.get(_READ_ONLY_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _page_up(n):
    return (n + _HEADER_PAGE - 1) // _HEADER_PAGE * _HEADER_PAGE


def _catalog_bytes(size):
    """The catalog the daemon puts at the end of a segment of size bytes
    (segment_plan in daemon/segment.c): one 32-byte slot per 2 KiB, a power
    of two from 64, halved while it would take more than 1/8 of the file,
    none when 64 do not fit."""
    slots = 64
    while slots < size // 2048:
        slots *= 2
    while slots >= 64 and _page_up(slots * 32) > size // 8:
        slots //= 2
    return _page_up(slots * 32) if slots >= 64 else 0


def _segment_size(data):
    """The segment whose data area holds data bytes (a whole number of
    pages): the header page, the data area, the catalog after it."""
    size = data + _HEADER_PAGE + _catalog_bytes(data + _HEADER_PAGE)
    while size - _HEADER_PAGE - _catalog_bytes(size) < data:
        size += _HEADER_PAGE
    return size


class _RingMemory:
    """What vLLM's ring keeps as ``shared_memory`` (a SharedMemory): here the
    daemon's segment as this ring's client maps it. ``name`` is the ring's
    name (what handle() passes, as vLLM's is the SharedMemory's), ``size``
    the ring's data_buffer_size, ``buf`` the client's mapping of the whole
    segment (read-only for a read-only reader). close() and unlink() do nothing: the
    daemon owns the segment."""

    def __init__(self, ring):
        self._ring = ring
        self.name = ring.name
        self.size = ring.data_buffer_size

    @property
    def buf(self):
        client = self._ring.client
        return client._mv if client is not None else None

    def close(self):
        """Nothing: the ring's close() closes its connection."""

    def unlink(self):
        """Nothing: the daemon removes its segment when it stops."""

    def __repr__(self):
        return "<shmbroker.vllm ring memory %r, %d bytes>" % (self.name, self.size)


class SingleWriterShmRingBuffer:
    """Stands in for vLLM's ring buffer: the connection to the shmbrokerd
    that holds the store's objects, and vLLM's ring interface over it.

    ``SingleWriterShmRingBuffer(data_buffer_size, name=None, create=False,
    socket_path=None, pool=None, ring_id=None, is_free_fn=None,
    read_only=None)``. The daemon is, in order: the one at socket_path
    (handle() passes it); the private daemon a writer of this name started;
    the one at $SHMBROKER_SOCKET (else /run/shmbroker/shmbroker.sock). When
    none answers, a writer (create=True) starts a private shmbrokerd with
    data_buffer_size bytes of data area (rounded up to whole pages) on a
    temporary socket (named_socket_path(name) when named) and stops it on
    close(); a reader raises ConnectionLost. On a shared daemon the size is
    not reserved for this ring (the daemon's segment is shared by all).
    pool: the daemon's pool to use (None: its default pool), passed to the
    Client and kept in handle(), so that readers use the same pool; a private
    daemon is started with that one pool, of the ring's size. is_free_fn:
    free_buf()'s check when it is given none (some vLLM versions pass
    SingleWriterShmObjectStorage.default_is_free_check here; the store does
    not use it).

    vLLM's ring interface, with vLLM's accounting: allocate_buf(size) ->
    (address, monotonic_id) places size + MD_SIZE bytes ([4-byte id][4-byte
    size][data]) in a ring of data_buffer_size bytes, oldest first, and raises
    vLLM's MemoryError when they do not fit before data_buffer_start;
    access_buf(address) yields (data, (id, size)); free_buf(is_free_fn,
    nbytes=None) frees from the oldest while is_free_fn(id, data) says so and
    returns the freed ids; clear() forgets every allocation. Attributes
    ``metadata`` (id -> address), ``monotonic_id_start``/``_end``,
    ``data_buffer_start``/``_end``, ``shared_memory`` (``.name``). Each
    allocation's bytes are an object of the daemon, pinned by the writer
    until free_buf() frees it, so that nothing else evicts it and a writer
    that dies leaves nothing pinned. Readers see the writer's allocations
    (read-only) while they live. A named ring's allocations are found by
    name; an unnamed one's through handle() (ring_id).

    Writers and readers connect read-write (a reader counts its reads in
    the chunks' seals); read_only=True (or $SHMBROKER_VLLM_READ_ONLY=1 when
    read_only is None) makes a reader's connection and mapping read-only,
    its reads then counted by requests it does not wait for. Attributes:
    ``data_buffer_size``, ``name``, ``is_writer``, ``read_only``,
    ``socket_path``, ``pool``,
    ``client`` (the shmbroker.Client), ``daemon`` (the private Daemon or
    None), ``lock`` (serialises the store's calls on the one connection).
    """

    # vLLM's figures: a 4-byte id and a 4-byte size before each allocation's data.
    ID_NBYTES = 4
    ID_MAX = 2 ** 31  # ids run 0 .. 2**31 - 1, then start again at 0
    SIZE_NBYTES = 4
    MD_SIZE = ID_NBYTES + SIZE_NBYTES

    def __init__(self, data_buffer_size: int, name: Optional[str] = None,
                 create: bool = False, socket_path: Optional[str] = None,
                 pool: Optional[str] = None, ring_id: Optional[str] = None,
                 is_free_fn: Optional[Callable] = None, read_only: Optional[bool] = None):
        self.data_buffer_size = int(data_buffer_size)
        self.pool = pool or None
        self.is_writer = bool(create)
        if read_only is None:
            read_only = not self.is_writer and _env_read_only()
        if read_only and self.is_writer:
            raise ValueError("A writer's ring (create=True) needs a read-write connection; "
                             "read_only=True is for readers.")
        self.read_only = bool(read_only)
        self.is_free_fn = is_free_fn
        self.daemon = None
        self.client = None
        self.lock = threading.RLock()
        _RINGS.add(self)  # a child made by fork() gets a lock of its own
        self._owner = os.getpid()
        self.monotonic_id_start = 0
        self.monotonic_id_end = 0
        self.data_buffer_start = 0
        self.data_buffer_end = 0
        self.metadata = {}  # monotonic_id -> address, of the writer's live allocations
        self._held = {}  # address -> the writer's Pin of that allocation
        if self.data_buffer_size <= 0:
            raise ValueError("data_buffer_size must be positive, not %d." % self.data_buffer_size)
        path = socket_path or self._find_daemon(name)
        if path is None and self.is_writer:
            path = self._start_daemon(name)
        if path is None:
            raise ConnectionLost("ECONNREFUSED", "No shmbrokerd for ring %r: none answers on %s%s, "
                                 "and a reader does not start one. Open the ring with the "
                                 "writer's handle(), or start the writer first."
                                 % (name, default_socket_path(),
                                    " nor on " + named_socket_path(name)
                                    if name and named_socket_path(name) else ""))
        self.socket_path = path
        try:
            self.client = self._connect()
        except BaseException:
            self.close()
            raise
        self.name = name if name is not None else self.client.info.get("segment")
        if ring_id is None:
            # A named ring's allocations are found by its name; an unnamed
            # writer's are its own (another unnamed ring may share the daemon).
            ring_id = self.name if name is not None or not self.is_writer else \
                "%s/%d/%s" % (self.name, os.getpid(), uuid.uuid4().hex)
        self.ring_id = ring_id
        self._key_prefix = "vr%s:" % hashlib.sha1(
            ring_id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        self.shared_memory = _RingMemory(self)

    def _connect(self):
        self._client_pid = os.getpid()
        # Not populated: mapping every page of a large ring up front cost more
        # than the daemon's reserving them (0.4 s for 1 GiB here); as with
        # vLLM's SharedMemory, a page is mapped when first touched.
        # Readers connect read-write unless told otherwise: a read-write
        # mapping lets a get count its awaited read in the chunk's seal,
        # with no request to the daemon (see the class's help).
        client = Client(self.socket_path, name="vllm-%s" % ("writer" if self.is_writer else
                                                              "reader"),
                        read_only=self.read_only, pool=self.pool, populate=False)
        # Arenas of 1/64 of the data area: a 64 KiB object's put asks for a
        # new one once in about 250 (the default, 256 KiB, once in three),
        # and reclaim still frees the ring in small steps.
        client.arena_want = max(client.arena_want, client.info["data_size"] // _ARENA_SHARE)
        return client

    def connection(self):
        """The ring's Client, usable in this process: in a child made by
        fork() a connection of its own is made (the inherited one is the
        parent's). ConnectionLost when the ring is closed."""
        if self.client is None:
            raise ConnectionLost("ENOTCONN", "This store is closed.")
        if self._client_pid != _pid[0]:
            self.client = self._connect()
            self._held.clear()  # the parent's pins: the child holds none
        return self.client

    def reconnect(self):
        """Connect again after the connection was lost (the daemon restarted,
        or a call was interrupted): the objects committed before stay, and so
        does the mapping when the daemon serves the same segment file."""
        self.connection().reconnect()

    @staticmethod
    def _find_daemon(name):
        if name:
            named = named_socket_path(name)
            if named and socket_answers(named):
                return named
        path = default_socket_path()
        return path if socket_answers(path) else None

    def _start_daemon(self, name):
        data = _page_up(self.data_buffer_size)
        named = named_socket_path(name) if name else None
        args = ["--max-object-size", str(data - _MAX_CHUNK_HEADER)]
        if self.pool is not None:
            # The daemon serves the pool the ring's clients name, and only it.
            args = ["--pool", "%s:%d,max-object-size=%d" % (self.pool, _segment_size(data),
                                                          data - _MAX_CHUNK_HEADER)]
        try:
            self.daemon = spawn_daemon(_segment_size(data), socket_path=named, args=args)
        except RuntimeError:
            # Another writer of this name may have started it meanwhile.
            if named and socket_answers(named):
                return named
            raise
        return self.daemon.socket_path

    def handle(self):
        """What a reader in another process passes to this class to attach:
        (data_buffer_size, name, False, socket_path, pool, ring_id), picklable."""
        return (self.data_buffer_size, self.name, False, self.socket_path, self.pool,
                self.ring_id)

    # ---- vLLM's ring interface ---------------------------------------------

    def int2byte(self, integer: int) -> bytes:
        """integer as the 4 little-endian signed bytes of an id or a size."""
        return integer.to_bytes(self.ID_NBYTES, "little", signed=True)

    def byte2int(self, byte_data) -> int:
        """The signed little-endian integer of byte_data."""
        return int.from_bytes(byte_data, "little", signed=True)

    def _buf_key(self, address):
        return "%s%x" % (self._key_prefix, address % self.data_buffer_size)

    def _place(self, total):
        """Where an allocation of total bytes goes in the ring, or None when
        it does not fit. The ring is [data_buffer_start, data_buffer_end)
        when not wrapped, else [start, size) and [0, end); one byte always
        stays free so that a full ring is never taken for an empty one, and
        an empty ring starts again at 0 (the fix vLLM's ring got)."""
        size = self.data_buffer_size
        if not self.metadata:
            self.data_buffer_start = self.data_buffer_end = 0
        start, end = self.data_buffer_start, self.data_buffer_end
        if start <= end:
            if end + total < size or (end + total == size and start > 0):
                return end
            return 0 if total < start else None  # wrap: the tail [end, size) is skipped
        return end if end + total < start else None

    def allocate_buf(self, size: int) -> Tuple[int, int]:
        """Allocate MD_SIZE + size bytes and return (address, monotonic_id):
        the id and size are written first, the data follows (access_buf).
        MemoryError "Not enough space in the data buffer, try calling
        free_buf() to free up space" when the ring has no room, or when the
        daemon has none (its message follows then)."""
        assert self.is_writer, "Only the writer can allocate buffers."
        assert size > 0, "Size must be greater than 0"
        total = size + self.MD_SIZE
        with self.lock:
            address = self._place(total)
            if address is None:
                raise NoSpace("ENOSPC", "Not enough space in the data buffer, try calling "
                              "free_buf() to free up space")
            monotonic_id = self.monotonic_id_end
            key = self._buf_key(address)
            client = self.connection()
            try:
                alloc = self._alloc(client, key, total)
            except NoSpace as e:
                raise NoSpace("ENOSPC", "Not enough space in the data buffer, try calling "
                              "free_buf() to free up space: the ring has room for %d bytes at "
                              "%d, but shmbrokerd has none: %s" % (total, address, e.message)) \
                    from None
            except ObjectTooLarge as e:
                raise NoSpace("ENOSPC", "Not enough space in the data buffer, try calling "
                              "free_buf() to free up space: %s" % e.message) from None
            with alloc:
                alloc.view[:self.MD_SIZE] = self.int2byte(monotonic_id) + self.int2byte(total)
            self._held[address] = client.get(key)
            if not self.metadata:
                self.data_buffer_start = address
            self.metadata[monotonic_id] = address
            self.data_buffer_end = address + total
            self.monotonic_id_end = (monotonic_id + 1) % self.ID_MAX
        return address, monotonic_id

    def _alloc(self, client, key, total):
        try:
            return client.alloc(key, total)
        except KeyExists:
            pass
        for obj in client.list(key, _LIST_LIMIT):
            if obj.get("key") == key and (obj.get("pins", 0) > 0 or obj.get("state") == "pending"):
                raise KeyExists("EEXIST", "Ring %r has another writer: its allocation at address "
                                "%d (object '%s') is live. vLLM's ring has one writer; give "
                                "this one another name, or close the other first."
                                % (self.name, int(key[len(self._key_prefix):], 16), key))
        # A leftover of this ring's name that nobody holds (a writer before
        # this one, or an allocation whose pin went with a lost connection).
        try:
            client.delete(key)
        except NotFound:
            pass
        return client.alloc(key, total)

    @contextlib.contextmanager
    def access_buf(self, address: int):
        """Yield (data, (monotonic_id, size)) of the allocation at address:
        data a memoryview of its data bytes (writable for the writer,
        read-only for readers), valid inside the block. Where no allocation
        of this ring lives, data is empty and the id -1, which no allocation
        has."""
        with self.lock:
            client = self.connection()
            held = self._held.get(address % self.data_buffer_size) if self.is_writer else None
            pin = None
            if held is not None:
                mv = client._mv[held.offset:held.offset + held.size]
            else:
                try:
                    pin = client.get(self._buf_key(address))
                except (NotFound, InvalidRequest):
                    mv = None
                else:
                    mv = pin.view
            try:
                if mv is None or len(mv) < self.MD_SIZE:
                    with memoryview(b"") as empty:
                        yield empty, (-1, 0)
                    return
                monotonic_id = self.byte2int(mv[:self.ID_NBYTES])
                size = self.byte2int(mv[self.ID_NBYTES:self.MD_SIZE])
                size = min(max(size, self.MD_SIZE), len(mv))
                with mv[self.MD_SIZE:size] as data:
                    yield data, (monotonic_id, size)
            finally:
                if pin is not None:
                    pin.release(noreply=True)

    def free_buf(self, is_free_fn: Optional[Callable] = None,
                 nbytes: Optional[int] = None) -> Iterable[int]:
        """Free allocations from the oldest, while is_free_fn(id, data) says
        they are free, until nbytes bytes are freed (None: the whole ring).
        Returns the freed ids, oldest first (a range, or two chained when
        the ids went past ID_MAX - 1). The daemon's objects of the freed
        allocations are deleted; a reader inside access_buf keeps its bytes
        until it leaves."""
        assert self.is_writer, "Only the writer can free buffers."
        if is_free_fn is None:
            is_free_fn = self.is_free_fn
        if is_free_fn is None:
            raise TypeError("free_buf() needs is_free_fn(monotonic_id, data) -> bool: pass one, "
                            "or give the ring one (is_free_fn=) when making it.")
        if nbytes is None:
            nbytes = self.data_buffer_size
        with self.lock:
            before = self.monotonic_id_start
            freed = 0
            while self.monotonic_id_start in self.metadata and freed < nbytes:
                monotonic_id = self.monotonic_id_start
                address = self.metadata[monotonic_id]
                with self.access_buf(address) as (data, md):
                    if not is_free_fn(monotonic_id, data):
                        break
                self._drop(address)
                del self.metadata[monotonic_id]
                self.monotonic_id_start = (monotonic_id + 1) % self.ID_MAX
                freed += md[1]
                if self.monotonic_id_start in self.metadata:
                    self.data_buffer_start = self.metadata[self.monotonic_id_start]
                else:
                    self.data_buffer_start = self.data_buffer_end = 0
            after = self.monotonic_id_start
        if after >= before:
            return range(before, after)
        return itertools.chain(range(before, self.ID_MAX), range(0, after))

    def _drop(self, address):
        """Unpin and delete the writer's allocation at address."""
        pin = self._held.pop(address % self.data_buffer_size, None)
        client = self.client
        if client is None or self._client_pid != os.getpid():
            return
        try:
            client.delete(self._buf_key(address), noreply=True)
            if pin is not None:
                pin.release(noreply=True)
        except ShmBrokerError:
            pass  # a lost connection took the pin; the object is anyone's to evict

    def clear(self) -> None:
        """Forget every allocation (their daemon objects are deleted) and
        start again at address 0, id 0."""
        assert self.is_writer, "Only the writer can clear the buffer."
        with self.lock:
            for address in list(self.metadata.values()):
                self._drop(address)
            self.metadata.clear()
            self._held.clear()
            self.monotonic_id_start = self.monotonic_id_end = 0
            self.data_buffer_start = self.data_buffer_end = 0

    def close(self) -> None:
        """Close the connection (the daemon releases its pins; a writer
        deletes its live allocations first) and stop the private daemon if
        this ring started one. Does nothing in a child made by fork(): the
        connection and the daemon are the parent's."""
        if os.getpid() != getattr(self, "_owner", None):
            return
        if getattr(self, "metadata", None) and self.is_writer and self.client is not None:
            try:
                self.clear()
            except ShmBrokerError:
                pass
        client, self.client = getattr(self, "client", None), None
        if client is not None:
            client.close()
        daemon, self.daemon = getattr(self, "daemon", None), None
        if daemon is not None:
            daemon.stop()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<shmbroker.vllm.SingleWriterShmRingBuffer %s %s%s>" % (
            "writer" if self.is_writer else "reader", self.socket_path,
            " (private daemon)" if self.daemon is not None else "")


# Every ring of this process, for the child of a fork(): the parent's thread
# that held a ring's lock at the fork does not exist in the child, so the
# lock would stay held there for ever.
_RINGS = weakref.WeakSet()


def _new_locks_in_child():
    for ring in list(_RINGS):
        ring.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)
