# SPDX-License-Identifier: Apache-2.0
"""The parts of vLLM's MessageQueue interface that vLLM's callers use beyond
enqueue and dequeue, on shmbroker.MessageQueue with a real daemon:
dequeue(timeout, indefinite, cancel=) as the multiprocess executor's worker
loop calls it, the acquire_write / acquire_read blocks, recv, vLLM's default
geometry, shutdown() that stops only the caller's reads (and
shutdown_queue(), which stops everyone's), the long-wait log line, and
create_from_process_group / create_from_process_group_single_reader over
both kinds of process group, including what they do with members that do
not reach the writer's daemon and with a writer that cannot make its queue.
"""

import inspect
import logging
import os
import pickle
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import shmbroker  # noqa: E402
from shmbroker import _futex, frames  # noqa: E402
from shmbroker import queue as Q  # noqa: E402
from shmbroker import MessageQueue  # noqa: E402

from pg_support import WAIT, barrier, distributed_run  # noqa: E402
from support import DaemonTest  # noqa: E402

MiB = 1024 * 1024
LONG_WAIT = "No available shared memory broadcast block found"


class Records(logging.Handler):
    """The messages logged to shmbroker.queue while in the block."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        self.logger = logging.getLogger("shmbroker.queue")
        self.level = self.logger.level
        self.logger.addHandler(self)
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)


class ApiTest(DaemonTest):
    DAEMON_SIZE = "64M"

    def setUp(self):
        if not _futex.supported:
            self.skipTest(_futex.why_unsupported)
        super().setUp()

    def pair(self, n_reader=1, **kw):
        """A writer and its readers, all of this process, ready."""
        kw.setdefault("max_chunk_bytes", 4096)
        kw.setdefault("max_chunks", 4)
        mq = MessageQueue(n_reader, socket_path=self.d.socket_path, **kw)
        self.addCleanup(mq.close)
        readers = []
        for rank in range(n_reader):
            r = MessageQueue.create_from_handle(mq.export_handle(), rank)
            self.addCleanup(r.close)
            r.wait_until_ready(WAIT)
            readers.append(r)
        mq.wait_until_ready(WAIT)
        return mq, readers

    def later(self, seconds, fn, *args):
        """fn(*args) in a thread after seconds (joined at the test's end)."""
        t = threading.Timer(seconds, fn, args)
        t.start()
        self.addCleanup(t.join)
        return t

    # vLLM's worker loop calls dequeue(indefinite=True); the keywords of
    # dequeue are vLLM's, (timeout, indefinite) by position as in current
    # vLLM, and positional calls in the order of releases that had (timeout,
    # cancel, indefinite) are taken in that order.
    def test_dequeue_keywords(self):
        mq, (r,) = self.pair()
        writer = self.later(0.05, mq.enqueue, "worker rpc")
        self.assertEqual(r.dequeue(indefinite=True), "worker rpc")
        writer.join()  # one write at a time: its enqueue may not have returned yet
        mq.enqueue(1)
        self.assertEqual(r.dequeue(timeout=WAIT, cancel=None, indefinite=False), 1)
        mq.enqueue(2)
        self.assertEqual(r.dequeue(WAIT, True), 2)
        mq.enqueue(3)
        self.assertEqual(r.dequeue(WAIT, threading.Event()), 3)
        mq.enqueue(4)
        self.assertEqual(r.dequeue(WAIT, None, True), 4)
        set_already = threading.Event()
        set_already.set()
        with self.assertRaisesRegex(RuntimeError, "cancelled"):
            r.dequeue(0.5, set_already, True)
        with self.assertRaises(TypeError):
            r.dequeue(WAIT, False, "not an event")
        with self.assertRaises(TimeoutError):
            r.dequeue(timeout=0.01, indefinite=True)

    # cancel: a threading.Event whose set() ends the wait with a
    # RuntimeError saying "cancelled" (vLLM's); a message already there is
    # returned even so; the queue goes on for everyone.
    def test_cancel_event(self):
        mq, (r,) = self.pair()
        cancel = threading.Event()
        self.later(0.05, cancel.set)
        with self.assertRaisesRegex(RuntimeError, "cancelled") as cm:
            r.dequeue(timeout=WAIT, cancel=cancel)
        self.assertIsInstance(cm.exception, shmbroker.Cancelled)
        mq.enqueue("still open", timeout=WAIT)
        self.assertEqual(r.dequeue(timeout=WAIT, cancel=cancel), "still open")
        with self.assertRaisesRegex(RuntimeError, "cancelled"):
            with r.acquire_read(timeout=WAIT, cancel=cancel):
                pass
        self.assertEqual(self.c.queue_list()[0]["state"], "open")

    # shutdown() is vLLM's: it stops the caller's own reads (a wait in
    # another thread wakes with "cancelled"), a message already published is
    # still returned, and nothing else changes: the other reader reads on,
    # the writer writes on, the queue stays open. shutdown_queue() is the
    # queue-wide stop.
    def test_shutdown_stops_own_reads_only(self):
        mq, (a, b) = self.pair(2)
        self.later(0.05, a.shutdown)
        with self.assertRaisesRegex(RuntimeError, "cancelled"):
            a.dequeue(timeout=WAIT)
        self.assertTrue(a.shutting_down)
        mq.shutdown()
        self.assertTrue(mq.shutting_down)
        mq.enqueue("after both", timeout=WAIT)
        self.assertEqual(b.dequeue(timeout=WAIT), "after both")
        self.assertEqual(a.dequeue(timeout=WAIT), "after both")
        with self.assertRaises(shmbroker.Cancelled):
            a.dequeue(timeout=WAIT)
        self.assertFalse(b.shutting_down)
        self.assertEqual(self.c.queue_list()[0]["state"], "open")
        mq.shutdown_queue()
        with self.assertRaises(shmbroker.Cancelled):
            b.dequeue(timeout=WAIT)
        with self.assertRaises(shmbroker.Cancelled):
            mq.enqueue("no more", timeout=WAIT)
        self.assertEqual(self.c.queue_list()[0]["state"], "shutdown")

    # vLLM's default geometry: 10 chunks of 24 MiB (it was 10 MiB).
    def test_default_geometry_is_vllms(self):
        params = inspect.signature(MessageQueue).parameters
        self.assertEqual(params["max_chunk_bytes"].default, 24 * MiB)
        self.assertEqual(params["max_chunks"].default, 10)

    # A long wait logs vLLM's line every VLLM_RINGBUFFER_WARNING_INTERVAL
    # seconds, a reader's and a writer's, with what it waits for; a reader
    # told indefinite=True logs nothing.
    def test_long_wait_logs_unless_indefinite(self):
        mq, (r,) = self.pair(max_chunks=2)
        old = os.environ.get(Q._WARNING_INTERVAL_ENV)
        os.environ[Q._WARNING_INTERVAL_ENV] = "1"
        self.addCleanup(lambda: os.environ.pop(Q._WARNING_INTERVAL_ENV) if old is None
                        else os.environ.__setitem__(Q._WARNING_INTERVAL_ENV, old))
        with Records() as rec:
            with self.assertRaises(TimeoutError):
                r.dequeue(timeout=1.5, indefinite=True)
        self.assertEqual(rec.messages, [])
        with Records() as rec:
            with self.assertRaises(TimeoutError):
                r.dequeue(timeout=1.5)
        self.assertTrue(rec.messages)
        self.assertIn(LONG_WAIT, rec.messages[0])
        self.assertIn("reader seat 0", rec.messages[0])
        mq.enqueue(0)
        mq.enqueue(1)
        with Records() as rec:
            with self.assertRaises(TimeoutError):
                mq.enqueue(2, timeout=1.5)
        self.assertTrue(rec.messages)
        self.assertIn(LONG_WAIT, rec.messages[0])
        self.assertIn("reader seat 0 to read message 0", rec.messages[0])

    # acquire_write gives the next slot's max_chunk_bytes to fill and
    # publishes them when the block ends; acquire_read gives a reader the
    # same bytes; each view is released after its block. A block left by an
    # exception publishes nothing (acquire_write) or leaves the message to be
    # read again (acquire_read): vLLM's blocks mark the slot written, or
    # read, only after the caller's code went through.
    def test_acquire_write_and_read(self):
        mq, (r,) = self.pair()
        with mq.acquire_write(timeout=WAIT) as buf:
            self.assertEqual(len(buf), 4096)
            buf[0] = 0
            buf[1:6] = b"hello"
        with self.assertRaises(ValueError):
            buf[0]
        with r.acquire_read(timeout=WAIT) as got:
            self.assertEqual(len(got), 4096)
            self.assertEqual(bytes(got[:6]), b"\0hello")
            self.assertTrue(got.readonly)
        with self.assertRaises(ValueError):
            got[0]
        with self.assertRaises(KeyError):
            with mq.acquire_write(timeout=WAIT) as buf:
                buf[:4] = b"lost"
                raise KeyError("the caller failed")
        with self.assertRaises(TimeoutError):
            r.dequeue(timeout=0)
        with mq.acquire_write(timeout=WAIT, ) as buf:
            buf[:5] = b"kept!"
        mq.enqueue("next")
        with self.assertRaises(KeyError):
            with r.acquire_read(timeout=WAIT, indefinite=True) as got:
                self.assertEqual(bytes(got[:5]), b"kept!")
                raise KeyError("the reader failed")
        with r.acquire_read(timeout=WAIT) as got:
            self.assertEqual(bytes(got[:5]), b"kept!")
        self.assertEqual(r.dequeue(timeout=WAIT), "next")
        big = b"b" * 10000  # larger than a slot: a store object
        mq.enqueue(big)
        with self.assertRaises(KeyError):
            with r.acquire_read(timeout=WAIT):
                raise KeyError("the reader failed")
        self.assertEqual(r.dequeue(timeout=WAIT), big)
        with self.assertRaises(TimeoutError):
            r.dequeue(timeout=0)
        with self.assertRaises(shmbroker.InvalidRequest):
            with r.acquire_write():
                pass
        with self.assertRaises(shmbroker.InvalidRequest):
            with mq.acquire_read():
                pass

    # Inside an acquire block, the next message cannot be written (its
    # slot would be the one held) nor read (the held one would be marked
    # read under the caller's view): EBUSY, and the block's message is
    # published, or read, as if nothing had been tried.
    def test_nested_blocks_are_refused(self):
        mq, (r,) = self.pair()
        with mq.acquire_write(timeout=WAIT) as buf:
            buf[:5] = b"outer"
            for inner in (lambda: mq.enqueue("inner", timeout=WAIT),
                          lambda: mq.acquire_write(timeout=WAIT).__enter__()):
                with self.assertRaises(shmbroker.InvalidRequest) as cm:
                    inner()
                self.assertEqual(cm.exception.code, "EBUSY")
        mq.enqueue("second")
        with r.acquire_read(timeout=WAIT) as got:
            for inner in (lambda: r.dequeue(timeout=WAIT),
                          lambda: r.acquire_read(timeout=WAIT).__enter__()):
                with self.assertRaises(shmbroker.InvalidRequest) as cm:
                    inner()
                self.assertEqual(cm.exception.code, "EBUSY")
            self.assertEqual(bytes(got[:5]), b"outer")
        self.assertEqual(r.dequeue(timeout=WAIT), "second")
        with self.assertRaises(TimeoutError):
            r.dequeue(timeout=0)

    # A timeout of infinity (or NaN, which no elapsed time exceeds) waits
    # as None does, as vLLM's comparison of the elapsed time with it does;
    # it raised OverflowError (ValueError) converting it to nanoseconds.
    def test_infinite_timeouts_wait(self):
        mq, (r,) = self.pair(max_chunks=2)
        for timeout in (float("inf"), float("nan")):
            writer = self.later(0.05, mq.enqueue, "late")
            self.assertEqual(r.dequeue(timeout), "late")
            writer.join()  # one write at a time: its enqueue may not have returned yet
            mq.enqueue(0)
            mq.enqueue(1)
            reader = self.later(0.05, r.dequeue, WAIT)
            mq.enqueue(2, timeout=timeout)
            reader.join()  # one read at a time, as for the writer
            self.assertEqual([r.dequeue(timeout=WAIT) for _ in range(2)], [1, 2])

    # A writer waiting for a slot in one thread holds the writer's turn: a
    # write from another thread is refused (EBUSY) instead of waiting for
    # the same slot, which both would then fill and publish (readers saw a
    # slot holding another message than the one published, or torn bytes).
    def test_write_while_another_thread_waits_is_refused(self):
        mq, (r,) = self.pair(max_chunks=2)
        mq.enqueue(0)
        mq.enqueue(1)  # the ring is full until r reads
        outcome = []
        t = threading.Thread(target=lambda: outcome.append(mq.enqueue("waiter", timeout=WAIT)))
        t.start()
        self.addCleanup(t.join)
        area = mq._area
        while t.is_alive() and not area._q32[Q.HEADER_OFFSETS["writer_waiting"] // 4]:
            t.join(0.001)  # until the waiter sleeps on the free word
        for write in (lambda: mq.enqueue("intruder", timeout=5),
                      lambda: mq.acquire_write(timeout=5).__enter__()):
            with self.assertRaises(shmbroker.InvalidRequest) as cm:
                write()
            self.assertEqual(cm.exception.code, "EBUSY")
        self.assertEqual([r.dequeue(timeout=WAIT) for _ in range(3)], [0, 1, "waiter"])
        t.join(WAIT)
        self.assertEqual(outcome, [None])
        with self.assertRaises(TimeoutError):
            r.dequeue(timeout=0)

    # A reader waiting for a message in one thread holds the seat's turn: a
    # read from another thread is refused (EBUSY) instead of taking the
    # same message, which both returned and the first marked read while
    # the other still read it in place.
    def test_read_while_another_thread_waits_is_refused(self):
        mq, (r,) = self.pair()
        got = []
        t = threading.Thread(target=lambda: got.append(r.dequeue(timeout=WAIT)))
        t.start()
        self.addCleanup(t.join)
        area = r._area
        while t.is_alive() and not area._q32[area._i_sstate + 1]:
            t.join(0.001)  # until the waiter sleeps (its seat's waiting flag)
        for read in (lambda: r.dequeue(timeout=5),
                     lambda: r.acquire_read(timeout=5).__enter__()):
            with self.assertRaises(shmbroker.InvalidRequest) as cm:
                read()
            self.assertEqual(cm.exception.code, "EBUSY")
        mq.enqueue("one")
        mq.enqueue("two")
        t.join(WAIT)
        self.assertEqual(got, ["one"])
        self.assertEqual(r.dequeue(timeout=WAIT), "two")

    # acquire_read of a message enqueue() sent gives its bytes in the
    # frames layout, in place, also for one larger than a slot (its object,
    # pinned for the block).
    def test_acquire_read_of_enqueued_messages(self):
        mq, (r,) = self.pair()
        for obj in ("small", b"L" * 10000):
            mq.enqueue(obj, timeout=WAIT)
            with r.acquire_read(timeout=WAIT) as got:
                parts = frames.parse(got)
                self.assertEqual(pickle.loads(parts[0], buffers=parts[1:]), obj)
                for p in parts:
                    p.release()
            with self.assertRaises(ValueError):
                got[0]

    # recv is vLLM's static helper that reads one pickled message (and its
    # out-of-band buffers) from a ZeroMQ socket, with a timeout.
    def test_recv(self):
        class FakeSocket:
            def __init__(self, frames_):
                self.frames = frames_
                self.polled = []

            def poll(self, timeout=None):
                self.polled.append(timeout)
                return bool(self.frames)

            def recv_multipart(self, copy=True):
                return self.frames

        bufs = []
        data = bytearray(b"out of band")
        first = pickle.dumps(pickle.PickleBuffer(data), protocol=5,
                             buffer_callback=bufs.append)
        sock = FakeSocket([first] + [b.raw() for b in bufs])
        self.assertEqual(bytes(MessageQueue.recv(sock, 1.5)), b"out of band")
        self.assertEqual(sock.polled, [1500])
        with self.assertRaises(TimeoutError):
            MessageQueue.recv(FakeSocket([]), 0)
        self.assertEqual(MessageQueue.recv(FakeSocket([pickle.dumps(7)]), None), 7)


def single_reader_member(pg, rank, world_size):
    """Every member makes its queue with one seat; the reader (global rank
    0) joins each and reads every member's message; the others get no
    handles."""
    mq, handles = MessageQueue.create_from_process_group_single_reader(pg, 1024, 4,
                                                                       reader_rank=0)
    out = None
    readers = []
    if rank != 0:
        if handles != []:
            out = "a non-reader got handles: %r" % (handles,)
    elif len(handles) != world_size:
        out = "the reader got %d handles" % len(handles)
    else:
        readers = [MessageQueue.create_from_handle(h, 0) for h in handles]
    # As vLLM's members do: every one waits until its reader is in.
    mq.wait_until_ready(WAIT)
    mq.enqueue(("from", rank, b"x" * (rank * 1000)), timeout=WAIT)
    for r, q in enumerate(readers):
        got = q.dequeue(timeout=WAIT)
        if got != ("from", r, b"x" * (r * 1000)) and out is None:
            out = "handle %d gave %.50r" % (r, got)
        q.close()
    barrier(pg)
    mq.close()
    return out


def remote_member(pg, rank, world_size):
    """Rank 1 uses another daemon socket: every member must refuse."""
    if rank == 1:
        os.environ["SHMBROKER_SOCKET"] = os.environ["OTHER_SOCKET"]
    try:
        MessageQueue.create_from_process_group(pg, 1024, 4, writer_rank=0)
        return "made a queue"
    except shmbroker.Unsupported as e:
        return "Unsupported: " + str(e)


def failing_writer_member(pg, rank, world_size):
    """The writer's queue cannot be made (1 slot; 2 at least): every member
    raises, none waits for a handle."""
    try:
        MessageQueue.create_from_process_group(pg, 1024, 1, writer_rank=1)
        return "made a queue"
    except shmbroker.ShmBrokerError as e:
        return "%s %s" % (type(e).__name__, e.code)


def disagreeing_writer_member(pg, rank, world_size):
    """Members that name different writer ranks (each itself): every member
    raises InvalidRequest naming what each said, none waits."""
    try:
        MessageQueue.create_from_process_group(pg, 1024, 4, writer_rank=rank)
        return "made a queue"
    except shmbroker.InvalidRequest as e:
        return "%s %s" % (e.code, e)


def external_handle_member(pg, rank, world_size):
    """external_writer_handle: the writer's member joins that queue (made
    outside the group, with every member a reader) and hands it on."""
    handle = pickle.loads(bytes.fromhex(os.environ["EXTERNAL_HANDLE"]))
    mq = MessageQueue.create_from_process_group(pg, 1024, 4, writer_rank=0,
                                                external_writer_handle=handle)
    got = mq.dequeue(timeout=WAIT)
    mq.close()
    return None if got == "from outside" else "got %r" % (got,)


def stray_writer_rank_member(pg, rank, world_size):
    """Rank 2 names a writer rank outside the group (5), the others 0: a
    member that refused it alone would leave the others in the first
    collective until the group's own timeout. Every member raises
    InvalidRequest naming what each said."""
    try:
        MessageQueue.create_from_process_group(pg, 1024, 4,
                                               writer_rank=5 if rank == 2 else 0)
        return "made a queue"
    except shmbroker.InvalidRequest as e:
        return "%s %s" % (e.code, e)


def reader_cannot_join_member(pg, rank, world_size):
    """Rank 2 cannot take its seat (its create_from_handle raises, as when
    its daemon restarted between the collectives): the writer must not
    wait for that seat for ever (blocking), every member raises."""
    if rank == 2:
        def refuse(handle, rank):
            raise shmbroker.ConnectionLost("ECONNRESET", "the daemon went away")
        MessageQueue.create_from_handle = staticmethod(refuse)
    try:
        mq = MessageQueue.create_from_process_group(pg, 1024, 4, writer_rank=0)
        mq.close()
        return "made a queue"
    except shmbroker.ShmBrokerError as e:
        return "%s %s" % (type(e).__name__, e.code)


def other_path_member(pg, rank, world_size):
    """The writer reaches the daemon through a link that only it has (as a
    container with the socket bind-mounted at a path of its own): gone
    once its queue is made. The readers, whose socket is the same file at
    its own path, read the queue there."""
    if rank == 0:
        os.environ["SHMBROKER_SOCKET"] = os.environ["WRITER_SOCKET"]
        made = MessageQueue.export_handle

        def export_then_unlink(self):
            if os.path.lexists(os.environ["WRITER_SOCKET"]):
                os.unlink(os.environ["WRITER_SOCKET"])
            return made(self)
        MessageQueue.export_handle = export_then_unlink
    mq = MessageQueue.create_from_process_group(pg, 1024, 4, writer_rank=0)
    try:
        if rank == 0:
            mq.enqueue("through its own path")
            return "ok"
        return mq.dequeue(WAIT)
    finally:
        mq.close()


def external_handle_elsewhere_member(pg, rank, world_size):
    """external_writer_handle of a queue whose readers are all on the
    writer's host, while rank 1 uses another daemon socket: every member
    raises Unsupported saying rank 1 does not reach the queue's daemon."""
    if rank == 1:
        os.environ["SHMBROKER_SOCKET"] = os.environ["OTHER_SOCKET"]
    handle = pickle.loads(bytes.fromhex(os.environ["EXTERNAL_HANDLE"]))
    try:
        MessageQueue.create_from_process_group(pg, 1024, 4, writer_rank=0,
                                               external_writer_handle=handle)
        return "made a queue"
    except shmbroker.Unsupported as e:
        return "Unsupported: " + str(e)


def stray_reader_rank_member(pg, rank, world_size):
    """create_from_process_group_single_reader with rank 2 naming a reader
    rank outside the group (5), the others 0: every member raises
    InvalidRequest naming what each said, none waits for rank 2."""
    try:
        MessageQueue.create_from_process_group_single_reader(
            pg, 1024, 4, reader_rank=5 if rank == 2 else 0)
        return "made a queue"
    except shmbroker.InvalidRequest as e:
        return "%s %s" % (e.code, e)


class BrokenGroup:
    """vLLM's StatelessProcessGroup for members that are threads of this
    process, whose collectives raise from the one numbered fail on (a group
    timing out, or a peer gone): every member sees it fail alike."""

    def __init__(self, shared, rank, fail):
        self.shared, self.rank, self.fail = shared, rank, fail
        self.world_size = len(shared["slots"])
        self.calls = 0

    def all_gather_obj(self, obj):
        self.calls += 1
        if self.calls >= self.fail:
            raise RuntimeError("the group's collective %d timed out" % self.calls)
        s = self.shared
        s["slots"][self.rank] = obj
        s["barrier"].wait(WAIT)
        out = list(s["slots"])
        s["barrier"].wait(WAIT)
        return out

    def broadcast_obj(self, obj, src):
        return self.all_gather_obj(obj)[src]


def broken_group_run(n, fail, member):
    """member(group) in a thread per rank of a BrokenGroup; {rank: result}."""
    shared = {"slots": [None] * n, "barrier": threading.Barrier(n)}
    out = {}

    def run(rank):
        try:
            out[rank] = member(BrokenGroup(shared, rank, fail))
        except Exception as e:  # noqa: BLE001  (the test looks at it)
            out[rank] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    return out


class GroupTest(DaemonTest):
    """create_from_process_group and its single-reader sibling."""

    DAEMON_SIZE = "64M"

    def setUp(self):
        if not _futex.supported:
            self.skipTest(_futex.why_unsupported)
        super().setUp()
        self.env = {"SHMBROKER_SOCKET": self.d.socket_path}

    def run_members(self, fn, kind, n=3, env=None):
        self.maxDiff = None
        return distributed_run(self, fn, n, kind, dict(self.env, **(env or {})))

    # The reader gathers every member's handle, in rank order, and reads
    # each member's queue; torch's reader_rank is a global rank.
    def test_single_reader_stateless(self):
        self.assertEqual(self.run_members(single_reader_member, "stateless"),
                         {r: "ok" for r in range(3)})

    def test_single_reader_torch(self):
        self.assertEqual(self.run_members(single_reader_member, "torch"),
                         {r: "ok" for r in range(3)})

    # A member that does not reach the writer's daemon: every member
    # raises Unsupported naming it, and no queue is made.
    def test_member_elsewhere_is_refused(self):
        out = self.run_members(remote_member, "stateless",
                               env={"OTHER_SOCKET": self.d.socket_path + ".elsewhere"})
        self.assertEqual(sorted(out), [0, 1, 2])
        for rank, what in out.items():
            self.assertTrue(what.startswith("Unsupported: Ranks [1] "), (rank, what))
            self.assertIn("shmbrokerd", what)
        self.assertEqual(self.c.queue_list(), [])

    # A writer that cannot make its queue sends its error instead of the
    # handle: the readers raise it too.
    def test_writer_failure_reaches_readers(self):
        out = self.run_members(failing_writer_member, "stateless")
        self.assertEqual(len(set(out.values())), 1, out)
        self.assertTrue(out[0].startswith("InvalidRequest"), out)

    # Members that disagree on writer_rank would each make a queue as its
    # writer and wait for readers that never come (or for a handle never
    # sent): every member raises InvalidRequest, with what each member
    # said, and no queue is made.
    def test_members_disagreeing_on_writer_rank_are_refused(self):
        out = self.run_members(disagreeing_writer_member, "stateless")
        self.assertEqual(sorted(out), [0, 1, 2])
        for rank, what in out.items():
            self.assertTrue(what.startswith("EINVAL "), (rank, what))
            self.assertIn("[0, 1, 2]", what)
        self.assertEqual(self.c.queue_list(), [])

    # A writer_rank or reader_rank outside the group is refused at once on
    # every member, before any collective (a group of one, in-process).
    def test_rank_outside_group(self):
        from vllm.distributed.utils import StatelessProcessGroup

        from pg_support import free_port

        pg = StatelessProcessGroup.create("127.0.0.1", free_port(), 0, 1)
        self.addCleanup(pg.close, 1)
        for bad in (1, -1, "0"):
            with self.assertRaisesRegex(shmbroker.InvalidRequest, "writer_rank"):
                MessageQueue.create_from_process_group(pg, 1024, 4, writer_rank=bad)
            with self.assertRaisesRegex(shmbroker.InvalidRequest, "reader_rank"):
                MessageQueue.create_from_process_group_single_reader(pg, 1024, 4,
                                                                     reader_rank=bad)
        self.assertEqual(self.c.queue_list(), [])


    # A member that names a writer rank outside the group, while the others
    # name 0: it takes part in the first collective all the same, so every
    # member raises InvalidRequest with what each said (none waits for it).
    def test_member_naming_a_writer_rank_outside_the_group(self):
        out = self.run_members(stray_writer_rank_member, "stateless")
        self.assertEqual(sorted(out), [0, 1, 2], out)
        for rank, what in out.items():
            self.assertTrue(what.startswith("EINVAL "), (rank, what))
            self.assertIn("[0, 0, 5]", what)
        self.assertEqual(self.c.queue_list(), [])


    # The same for create_from_process_group_single_reader's reader_rank.
    def test_member_naming_a_reader_rank_outside_the_group(self):
        out = self.run_members(stray_reader_rank_member, "stateless")
        self.assertEqual(sorted(out), [0, 1, 2], out)
        for rank, what in out.items():
            self.assertTrue(what.startswith("EINVAL "), (rank, what))
            self.assertIn("[0, 0, 5]", what)
        self.assertEqual(self.c.queue_list(), [])

    # A reader on the writer's host that cannot take its seat: every member
    # raises (the writer does not wait for the seat for ever) and the
    # writer's queue is removed.
    def test_reader_that_cannot_join_fails_every_member(self):
        out = self.run_members(reader_cannot_join_member, "stateless")
        self.assertEqual(out, {0: "ConnectionLost ECONNRESET", 1: "ConnectionLost ECONNRESET",
                               2: "ConnectionLost ECONNRESET"})
        self.assertEqual(self.c.queue_list(), [])

    # The group's collectives failing after the writer made its queue (the
    # handle's broadcast, or the round after it): the writer's queue is
    # closed, not left on the daemon for as long as the process lives.
    def test_group_failing_after_the_queue_is_made_leaves_no_queue(self):
        for fail in (2, 3):
            out = broken_group_run(3, fail, lambda g: MessageQueue.create_from_process_group(
                g, 1024, 4, writer_rank=0, socket_path=self.d.socket_path))
            self.assertEqual(sorted(out), [0, 1, 2], (fail, out))
            self.assertTrue(all(isinstance(e, RuntimeError) for e in out.values()),
                            (fail, out))
            self.assertEqual(self.c.queue_list(), [], fail)


    # Members whose socket is the writer's at another path (a bind mount in
    # a container of their own): they are on the writer's host, and each
    # joins through its own path, not the writer's.
    def test_members_reaching_the_daemon_at_other_paths(self):
        link = self.d.socket_path + ".writer"
        os.symlink(self.d.socket_path, link)
        self.addCleanup(lambda: os.path.lexists(link) and os.unlink(link))
        out = self.run_members(other_path_member, "stateless", env={"WRITER_SOCKET": link})
        self.assertEqual(out, {0: "ok", 1: "through its own path", 2: "through its own path"})
        self.assertEqual(self.c.queue_list(), [])


    # external_writer_handle of a queue with no remote seats, and a member
    # that does not reach its daemon: every member raises, naming that
    # member as one that does not reach the queue's daemon (not as one
    # missing from the local readers, which it is not).
    def test_external_writer_handle_with_a_member_elsewhere(self):
        outside = MessageQueue(3, socket_path=self.d.socket_path, max_chunk_bytes=1024,
                               max_chunks=4)
        self.addCleanup(outside.close)
        out = self.run_members(external_handle_elsewhere_member, "stateless", env={
            "EXTERNAL_HANDLE": pickle.dumps(outside.export_handle()).hex(),
            "OTHER_SOCKET": self.d.socket_path + ".elsewhere"})
        self.assertEqual(sorted(out), [0, 1, 2], out)
        for rank, what in out.items():
            self.assertTrue(what.startswith("Unsupported: "), (rank, what))
            self.assertIn("Rank 1 does not reach the daemon of queue", what)
        self.assertEqual([q["seats_live"] for q in self.c.queue_list()], [0])

    # external_writer_handle: the writer's member joins a queue made
    # outside the group, and hands its handle to the other members.
    def test_external_writer_handle(self):
        outside = MessageQueue(3, socket_path=self.d.socket_path, max_chunk_bytes=1024,
                               max_chunks=4)
        self.addCleanup(outside.close)
        handle = pickle.dumps(outside.export_handle()).hex()
        results = {}
        t = threading.Thread(target=lambda: results.update(self.run_members(
            external_handle_member, "stateless", env={"EXTERNAL_HANDLE": handle})))
        t.start()
        outside.wait_until_ready(WAIT)
        outside.enqueue("from outside")
        t.join()
        self.assertEqual(results, {r: "ok" for r in range(3)})


if __name__ == "__main__":
    unittest.main()
