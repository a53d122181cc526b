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
with acquire or stores with release order, the area (_queue_area) calls
_futex.fence_acquire after the plain load or _futex.fence_release before
the plain store; both are None on x86-64, whose ordering (TSO) already
makes every aligned load an acquire and every store a release.

Messages are pickled with protocol 5; out-of-band buffers (numpy arrays'
data, pickle.PickleBuffer) are written straight into the slot (or the
overflow object) in the frames layout (frames.py): frame 0 the pickle
stream, then each buffer, with the count and the lengths in its header.
Unpickling runs code the bytes name: share a queue only among processes that
trust each other, as with vLLM's.

This module keeps MessageQueue (its making, from a handle or a process
group, readiness, shutdown and close) and Handle; the rest are rooms of
their own, whose names it re-exports: _queue_messages (enqueue, dequeue
and their blocks, mixed into MessageQueue), _queue_area (one member's view
of the area), _queue_wait (its waits, mixed into _Area), _queue_layout
(proto/layout_queue.h's constants), _queue_codec (a message as frames) and
_queue_rebuild (the calls a buffer message names).
"""

import dataclasses
import logging
import mmap
import os
import pickle
import secrets
import select
import socket
import time
from typing import List, Optional

from . import client as _client
from .client import Client
from . import errors as _errors
from .errors import error_for as _error_for
from .errors import (Cancelled, ConnectionLost, EndOfQueue, InvalidRequest, KeyExists,
                     NotFound, ProtocolError, ShmBrokerError, Timeout, Unsupported)
# The area (its mapping, seats and slots), its waits and its layout are
# rooms of their own; every name stays importable from here, as before.
from ._queue_area import _Area  # noqa: F401
from ._queue_layout import (  # noqa: F401
    ALIGN, HEADER_OFFSETS, HEADER_PAGE, NAME_MAX, QUEUE_MAGIC, QUEUE_OPEN, QUEUE_SHUTDOWN,
    QUEUE_VERSION, QUEUE_WRITER_GONE, SEATS_MAX, SEAT_DEAD, SEAT_FREE, SEAT_LIVE, SEAT_OFFSETS,
    SEAT_SIZE, SLOT, SLOTS_MAX, SLOTS_MIN, SLOT_HEADER, SLOT_INLINE, SLOT_OBJECT, SLOT_OFFSETS,
    SLOT_SIZE_MAX, SLOT_SIZE_MIN, _GEOMETRY, _H, _cancelled, _closed_meanwhile, _corrupt,
    _round_up, _slots_offset_for, _stopped_here, queue_size)
from ._queue_wait import (  # noqa: F401
    SPIN_LIMIT_US, SPIN_MAX_DEFAULT_US, SPIN_MAX_NS, SPIN_MIN_NS, SPIN_START_NS,
    _CANCEL_POLL_NS, _FIT_LOOKS, _GAP_MAX_NS, _MARK_SLEEP_NS, _MINUS_ONE, _NAP_SLACK_NS,
    _POLLS_OFF_FOR, _POLL_AHEAD, _POLL_WAITS, _POLL_WALL_PARTS, _POLL_WINDOW, _SLICE_NS,
    _SPIN_MAX_ENV, _SPIN_PAUSE_NS, _TIMEOUT_FOREVER_S, _WAIT_ENV, _WARNING_INTERVAL_ENV,
    _WARNING_INTERVAL_S, _now, _sched_yield, _thread_time, _usable_cpus, _wait_settings,
    _warning_interval_ns)
# So are the messages' encoding and the calls that rebuild buffers, these
# first: the codec's streams, made at its import, name them in this module
# (_queue_rebuild says why).
from ._queue_rebuild import (  # noqa: F401
    _NDIM_MAX, _elements, _rebuild_bytearray, _rebuild_bytes, _rebuild_memoryview,
    _rebuild_tensor, _shape_of)
from ._queue_codec import (  # noqa: F401
    _BYTEARRAY_LEN, _BYTEARRAY_STREAM, _BYTES_LEN, _BYTES_STREAM, _ONE_FRAME, _ONE_FRAME_AT,
    _ONE_FRAME_PAD, _OOB_MIN, _SECOND_LENGTH, _STREAMS, _TWO_FRAMES, _TWO_FRAMES_PAD, _ZEROS_64,
    _OutOfBand, _decode, _message_frames, _message_size, _oob_frames, _read_message,
    _tensor_frames, _write_message)
# And MessageQueue's messages: enqueue(), dequeue() and their blocks, mixed in.
from ._queue_messages import _READ_BUSY, _WRITE_BUSY, _Messages, _wait_options  # noqa: F401

__all__ = ["MessageQueue", "Handle"]

_log = logging.getLogger(__name__)

# vLLM's default slot size (max_chunk_bytes) since it grew from 10 MiB: a
# drop-in made with vLLM's defaults has vLLM's geometry, 10 slots of 24 MiB.
DEFAULT_MAX_CHUNK_BYTES = 24 * 1024 * 1024
DEFAULT_MAX_CHUNKS = 10

# wait_until_ready() looks at the seats this often (no futex is bumped when a
# seat is taken: it is set-up, not the data path).
_READY_POLL_S = (0.001, 0.02)
_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0)


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


class MessageQueue(_Messages):
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
