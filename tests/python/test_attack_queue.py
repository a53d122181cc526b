# SPDX-License-Identifier: Apache-2.0
"""The queue's small messages and the code each member writes for its two
atomic operations (_futex.bind), attacked as a careless user and a hostile
member would: queues opened and closed by the thousand, executable memory
refused, close() from another thread under a read or a write, a child made
by fork() using the parent's queue. What must hold: no page of code left
behind, the same messages either way, no call on a word no longer mapped
(that would kill the process), a clear error in the child."""

import gc
import os
import threading
import unittest
import unittest.mock

import support  # noqa: F401  (puts the package on the path)
import shmbroker
from shmbroker import MessageQueue, _futex

WAIT = 30.0


def map_lines():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def code_pages():
    """Private anonymous mappings that are executable: where bind() writes."""
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if fields[1].startswith("r-x") and len(fields) == 5:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                n += (end - start) // 4096
    return n


class QueueAttackTest(support.DaemonTest):
    DAEMON_SIZE = "16M"

    def pair(self, slot=4096, slots=4):
        mq = MessageQueue(1, socket_path=self.d.socket_path, max_chunk_bytes=slot,
                          max_chunks=slots)
        self.addCleanup(mq.close)
        reader = MessageQueue.create_from_handle(mq.export_handle(), 0)
        self.addCleanup(reader.close)
        reader.wait_until_ready(WAIT)
        mq.wait_until_ready(WAIT)
        return mq, reader

    # A thousand queues opened, used and closed leave no mapping behind: the
    # page of code each member writes for its atomics goes with it.
    def test_open_close_leaves_no_pages(self):
        def cycle(i):
            mq, reader = self.pair()
            mq.enqueue(("small", i))
            self.assertEqual(reader.dequeue(timeout=WAIT), ("small", i))
            reader.close()
            mq.close()

        for i in range(20):  # warm: the allocator's own mappings settle
            cycle(i)
        gc.collect()
        lines, pages = map_lines(), code_pages()
        for i in range(1000):
            cycle(i)
        gc.collect()
        self.assertLessEqual(map_lines(), lines + 4)
        self.assertLessEqual(code_pages(), pages)

    # Where executable memory is refused (mprotect fails, as under
    # MemoryDenyWriteExecute=), a member's bound operations fall back to
    # the generic ones: messages go and come the same, and the page
    # written for the code is not left behind.
    def test_mprotect_refused_falls_back(self):
        gc.collect()
        lines = map_lines()
        with unittest.mock.patch.dict(_futex._funcs, {"mprotect": lambda *args: -1}):
            mq, reader = self.pair()
            self.assertFalse(mq._area._ops.machine_code)
            self.assertFalse(reader._area._ops.machine_code)
            for i in range(50):
                msg = ("m", i, bytes(i * 100))
                mq.enqueue(msg)
                self.assertEqual(reader.dequeue(timeout=WAIT), msg)
            reader.close()
            mq.close()
        gc.collect()
        self.assertLessEqual(map_lines(), lines + 2)

    # close() from another thread while the reader waits in dequeue() and
    # the writer in enqueue() (on a full queue): both calls end with an
    # error, the process lives (a bound operation on a word no longer mapped
    # would kill it), and nothing is left mapped.
    def test_close_from_another_thread_under_calls(self):
        for rep in range(20):
            mq, reader = self.pair(slots=2)
            ended = []

            def read():
                try:
                    while True:
                        reader.dequeue(timeout=WAIT)
                except shmbroker.ShmBrokerError as e:
                    ended.append(e.code)

            def write():
                try:
                    i = 0
                    while True:
                        mq.enqueue(("w", i), timeout=WAIT)
                        i += 1
                except shmbroker.ShmBrokerError as e:
                    ended.append(e.code)

            threads = [threading.Thread(target=read), threading.Thread(target=write)]
            for t in threads:
                t.start()
            for _ in range(rep * 50):
                pass
            (reader if rep % 2 else mq).close()
            (mq if rep % 2 else reader).close()
            for t in threads:
                t.join(WAIT)
                self.assertFalse(t.is_alive())
            self.assertEqual(len(ended), 2, ended)
            self.assertIsNone(mq._area)
            self.assertIsNone(reader._area)

    # A child made by fork() that uses the parent's members gets a clear
    # error (ECHILD), and the parent's members go on as before.
    def test_fork_child_uses_the_parents_queue(self):
        mq, reader = self.pair()
        mq.enqueue("before")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for call in (lambda: reader.dequeue(timeout=1), lambda: mq.enqueue("child")):
                    try:
                        call()
                        code = 2
                    except shmbroker.ShmBrokerError as e:
                        if e.code != "ECHILD":
                            code = 3
                if code == 1:
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertEqual(reader.dequeue(timeout=WAIT), "before")
        mq.enqueue("after")
        self.assertEqual(reader.dequeue(timeout=WAIT), "after")
