# SPDX-License-Identifier: Apache-2.0
"""vLLM's tests/distributed/test_shm_broadcast.py, behaviour by behaviour,
on shmbroker.MessageQueue: four members of a process group (torch.distributed
with gloo, and vLLM's StatelessProcessGroup through the stand-in under
vllm_standin/) make their queue with create_from_process_group, writer rank 2.

Ported: test_shm_broadcast (numpy arrays, about half of them larger than the
40 KiB slots, each reader gets every one, equal, in order),
test_message_queue_shutdown (a reader's wait times out; shutdown() from another thread of the
reader ends its next wait with RuntimeError "cancelled"; shutting_down is
set; the writer's own shutdown() stops nothing of the readers'),
test_message_queue_idle_wake and _busy_to_idle (a message sent to a reader
that went idle, or that has just been reading, reaches it; every member's
shutdown() then sets shutting_down).
Not ported, being vLLM's internals rather than behaviour: the counts of
calls to its private _spin_condition.wait (our readers sleep on a futex and
have no such object) and its fields last_read and busy_loop_s.

vLLM mirrored: tests/distributed/test_shm_broadcast.py at commit
00c4c3f6785b601529004c5aaee29c5949128f2b (test_shm_broadcast,
test_message_queue_shutdown), and its later form on main (the shutdown test
expecting "cancelled", the idle and busy tests); the interface of
vllm/distributed/device_communicators/shm_broadcast.py on main as its API
reference of 2026-09 gives it, with the cancel keyword of the releases that
had it.
"""

import os
import random
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

from shmbroker import _futex  # noqa: E402
from shmbroker import MessageQueue  # noqa: E402

from pg_support import WAIT, barrier, distributed_run, numpy_or_skip  # noqa: E402
from support import DaemonTest  # noqa: E402

KiB = 1024
WRITER = 2
MEMBERS = 4


def get_arrays(n, seed):
    """vLLM's get_arrays: n int64 arrays of 1 to 9999 elements (40 KB on
    average), the same on every member for a seed."""
    import numpy as np

    rng = np.random.RandomState(seed)
    sizes = rng.randint(1, 10000, n)
    return [rng.randint(1, 100, int(k)) for k in sizes]


def broadcast_member(n):
    """test_shm_broadcast's member: the writer picks a seed and sends it over
    the group; every member makes the arrays; the writer broadcasts each,
    the readers check each, all with random short sleeps."""

    def run(pg, rank, world_size):
        import numpy as np

        from shmbroker import _groups

        mq = MessageQueue.create_from_process_group(pg, 40 * KiB, 2, WRITER)
        group = _groups.wrap(pg)
        seed = group.broadcast(random.randint(0, 1000) if rank == WRITER else None, WRITER)
        barrier(pg)
        arrays = get_arrays(n, seed)
        rng = random.Random(rank)
        for i, x in enumerate(arrays):
            y = mq.broadcast_object(x if rank == WRITER else None)
            if not np.array_equal(x, y):
                return "array %d (seed %d) differs: %.60r" % (i, seed, y)
            if rng.random() < 0.1:
                time.sleep(rng.random() / 1000)
        barrier(pg)
        mq.close()
        return None

    return run


def shutdown_member(pg, rank, world_size):
    """test_message_queue_shutdown's member."""
    mq = MessageQueue.create_from_process_group(pg, 40 * KiB, 2, WRITER)
    barrier(pg)
    if rank == WRITER:
        # Writes nothing; its own shutdown() must not stop the readers'.
        mq.shutdown()
        if not mq.shutting_down:
            return "the writer's shutting_down is not set"
        barrier(pg)
        mq.enqueue("after the writer's shutdown", timeout=WAIT)
        barrier(pg)
        mq.close()
        return None
    event = threading.Event()

    def shutdown_thread():
        event.wait()
        mq.shutdown()

    t = threading.Thread(target=shutdown_thread)
    t.start()
    try:
        mq.dequeue(timeout=0.01)
        return "dequeue with nothing sent returned"
    except TimeoutError:
        pass
    barrier(pg)  # the writer's shutdown() is done
    try:
        got = mq.dequeue(timeout=WAIT)
        if got != "after the writer's shutdown":
            return "got %r" % (got,)
    except Exception as e:
        return "the writer's shutdown() stopped a reader: %s: %s" % (type(e).__name__, e)
    event.set()
    try:
        mq.dequeue(timeout=WAIT)
        return "dequeue after this reader's shutdown() returned"
    except RuntimeError as e:
        if "cancelled" not in str(e):
            return "RuntimeError without 'cancelled': %s" % e
    finally:
        t.join()
    if not mq.shutting_down:
        return "shutting_down is not set"
    barrier(pg)
    mq.close()
    return None


def idle_busy_member(pg, rank, world_size):
    """test_message_queue_idle_wake and _busy_to_idle's member: a reader
    that has waited in vain (idle) gets the message sent after a pause, and
    one that has just read (busy) gets the next; twice; then shutdown()."""
    import numpy as np

    mq = MessageQueue.create_from_process_group(pg, 40 * KiB, 2, WRITER)
    messages = ["hello world", np.arange(100) % 7, 12345, list(range(3))]
    for i, message in enumerate(messages):
        if rank == WRITER:
            barrier(pg)
            time.sleep(0.05)  # the readers are asleep in their wait by now, mostly
            mq.enqueue(message, timeout=WAIT)
            continue
        if i % 2 == 0:
            try:
                mq.dequeue(timeout=0.01)
                return "message %d: a dequeue before it was sent returned" % i
            except TimeoutError:
                pass
        barrier(pg)
        got = mq.dequeue(timeout=WAIT)
        same = np.array_equal(got, message) if isinstance(message, np.ndarray) \
            else got == message
        if not same:
            return "message %d: got %r" % (i, got)
    mq.shutdown()
    if not mq.shutting_down:
        return "shutting_down is not set"
    barrier(pg)
    mq.close()
    return None


class ShmBroadcastConformance(DaemonTest):
    """vLLM's test_shm_broadcast.py over both kinds of process group."""

    DAEMON_SIZE = "64M"

    def setUp(self):
        if not _futex.supported:
            self.skipTest(_futex.why_unsupported)
        super().setUp()
        self.env = {"SHMBROKER_SOCKET": self.d.socket_path}

    def run_members(self, fn, kind):
        self.maxDiff = None
        out = distributed_run(self, fn, MEMBERS, kind, self.env)
        self.assertEqual(out, {r: "ok" for r in range(MEMBERS)})
        # Every member closed its queue: the daemon deleted it (temporary).
        self.assertEqual(self.c.queue_list(), [])

    # test_shm_broadcast: 4 members, writer rank 2, 40 KiB slots, 2 of
    # them; vLLM sends 10,000 arrays (test_queues.py does too, without a
    # group): 1,000 here, the same sizes, for time.
    def test_shm_broadcast_stateless(self):
        numpy_or_skip(self)
        self.run_members(broadcast_member(1000), "stateless")

    def test_shm_broadcast_torch(self):
        numpy_or_skip(self)
        self.run_members(broadcast_member(1000), "torch")

    # test_message_queue_shutdown.
    def test_message_queue_shutdown_stateless(self):
        self.run_members(shutdown_member, "stateless")

    def test_message_queue_shutdown_torch(self):
        self.run_members(shutdown_member, "torch")

    # test_message_queue_idle_wake and test_message_queue_busy_to_idle.
    def test_message_queue_idle_and_busy_stateless(self):
        numpy_or_skip(self)
        self.run_members(idle_busy_member, "stateless")

    def test_message_queue_idle_and_busy_torch(self):
        numpy_or_skip(self)
        self.run_members(idle_busy_member, "torch")


if __name__ == "__main__":
    unittest.main()
