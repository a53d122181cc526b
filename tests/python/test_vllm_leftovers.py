# SPDX-License-Identifier: Apache-2.0
"""A drop-in store's leftovers on a shared daemon: a writer that closes, or
dies (SIGKILL included), leaves no object that stops another client's
allocation. Its objects await reads that nobody may ever make; the oldest of
them would block every client's reclaim.
"""

import gc
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import shmbroker  # noqa: E402
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer  # noqa: E402

KiB = 1024
# The keys of the bases stores count their pairs from.
BASE_PREFIX = "shmbroker-vllm-base:"

# A writer store on the daemon at argv[2]: puts 6 objects of 6 KiB that
# await 2 reads each, says "ready", then waits to be killed (or, given
# "close" on stdin, closes its store and says "closed").
WRITER = """
import sys
sys.path.insert(0, sys.argv[1])
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer
ring = SingleWriterShmRingBuffer(64 * 1024, create=True, socket_path=sys.argv[2])
store = ShmBrokerObjectStorage(16 * 1024, 2, ring)
for i in range(6):
    store.put("left-%d" % i, b"x" * 6000)
print("ready", flush=True)
if sys.stdin.readline().strip() == "close":
    store.close()
    print("closed", flush=True)
sys.stdin.read()
"""


# A writer killed as soon as the daemon committed its second object, before
# put() returns.
KILLED_AFTER_COMMIT = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import shmbroker.client
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer
ring = SingleWriterShmRingBuffer(64 * 1024, create=True, socket_path=sys.argv[2])
store = ShmBrokerObjectStorage(16 * 1024, 2, ring)
store.put("first", b"a" * 100)
commit = shmbroker.client.Allocation.commit
def commit_and_die(self):
    commit(self)
    os.kill(os.getpid(), signal.SIGKILL)
shmbroker.client.Allocation.commit = commit_and_die
commit_at = shmbroker.client.Client._commit_at
def commit_at_and_die(self, *args):
    commit_at(self, *args)
    os.kill(os.getpid(), signal.SIGKILL)
shmbroker.client.Client._commit_at = commit_at_and_die
publish = shmbroker.client.Client._publish
def publish_and_die(self, *args):
    if publish(self, *args) is not None:
        os.kill(os.getpid(), signal.SIGKILL)
shmbroker.client.Client._publish = publish_and_die
store.put("second", b"b" * 6000)
"""

# A writer killed after two puts and a clear() (which puts a base anew).
KILLED = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer
ring = SingleWriterShmRingBuffer(64 * 1024, create=True, socket_path=sys.argv[2])
store = ShmBrokerObjectStorage(16 * 1024, 2, ring)
store.put("first", b"a" * 100)
store.clear()
store.put("first", b"a" * 100)
store.put("second", b"b" * 100)
os.kill(os.getpid(), signal.SIGKILL)
"""

# A writer whose guard is killed after its first put, which puts twice more
# and is killed.
GUARD_KILLED = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer
ring = SingleWriterShmRingBuffer(64 * 1024, create=True, socket_path=sys.argv[2])
store = ShmBrokerObjectStorage(16 * 1024, 2, ring)
store.put("first", b"a" * 100)
guard = store._guard[2]
guard.kill()
guard.wait()
store.put("second", b"b" * 100)
store.put("third", b"c" * 100)
os.kill(os.getpid(), signal.SIGKILL)
"""

# A writer that forks a child which stays (printing its pid), then is killed.
FORKS_THEN_KILLED = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer
ring = SingleWriterShmRingBuffer(64 * 1024, create=True, socket_path=sys.argv[2])
store = ShmBrokerObjectStorage(16 * 1024, 2, ring)
store.put("first", b"a" * 100)
pid = os.fork()
if pid == 0:
    time.sleep(600)
    os._exit(0)
print(pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


# A writer of the ring named argv[3] that puts two objects, prints their
# pairs, and is killed: its guard deletes them.
NAMED_KILLED = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer
ring = SingleWriterShmRingBuffer(64 * 1024, name=sys.argv[3], create=True,
                                 socket_path=sys.argv[2])
store = ShmBrokerObjectStorage(16 * 1024, 2, ring)
print("%d %d %d %d" % (store.put("first", b"a" * 100) + store.put("second", b"b" * 100)),
      flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


class LeftoversTest(unittest.TestCase):
    def setUp(self):
        self.daemon = shmbroker.spawn_daemon(64 * KiB, args=["--max-object-size", "49152"])
        self.addCleanup(self.daemon.stop)
        self.client = shmbroker.Client(self.daemon.socket_path)
        self.addCleanup(self.client.close)

    def writer(self):
        child = subprocess.Popen([sys.executable, "-c", WRITER, PACKAGE_DIR,
                                  self.daemon.socket_path],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.addCleanup(child.stdout.close)
        self.addCleanup(child.stdin.close)
        self.addCleanup(child.wait)
        self.addCleanup(child.kill)
        self.assertEqual(child.stdout.readline().strip(), b"ready")
        return child

    def assert_blocked(self):
        """The room another client needs is held by the writer's objects."""
        with self.assertRaises(MemoryError) as cm:
            self.client.put("mine", b"y" * (36 * KiB))
        self.assertIn("'left-0' blocks reclaim", str(cm.exception))

    # A writer killed with SIGKILL: another client can allocate the room its
    # unread objects held (its guard deletes them once it is gone).
    def test_killed_writer(self):
        child = self.writer()
        self.assert_blocked()
        child.send_signal(signal.SIGKILL)
        child.wait()
        # Waits (bounded) for the room: the guard sees the writer's end.
        self.client.put("mine", b"y" * (36 * KiB), wait_ms=30000)
        wait_until(lambda: self.client.list(prefix="left-") == [],
                   "the guard to delete the killed writer's objects")

    # A key of the killed writer's that another client deleted and put again
    # is that client's object: the guard leaves it.
    def test_guard_deletes_only_the_writers_objects(self):
        child = self.writer()
        self.client.delete("left-5")
        # (the spacer goes after the deleted chunk, which keeps its id: the
        # new "left-5" is at neither the old one's offset nor its id)
        self.client.put("spacer", b"s", readers=1)
        self.client.put("left-5", b"someone else's", readers=1)
        child.send_signal(signal.SIGKILL)
        child.wait()
        wait_until(lambda: [o["key"] for o in self.client.list(prefix="left-")] == ["left-5"],
                   "the guard to delete the killed writer's objects")
        self.assertEqual(self.client.read("left-5"), b"someone else's")

    # A writer that closes its store deletes its objects first.
    def test_closed_writer(self):
        child = self.writer()
        self.assert_blocked()
        child.stdin.write(b"close\n")
        child.stdin.flush()
        self.assertEqual(child.stdout.readline().strip(), b"closed")
        self.assertEqual([o["key"] for o in self.client.list(prefix="left-")], [])
        self.client.put("mine", b"y" * (36 * KiB))

    # Unnamed stores opened and closed one after another leave no base of
    # their pairs behind (each has its own, which nobody else reads).
    def test_closed_unnamed_stores_leave_no_base(self):
        for i in range(3):
            ring = SingleWriterShmRingBuffer(64 * KiB, create=True,
                                             socket_path=self.daemon.socket_path)
            store = ShmBrokerObjectStorage(16 * KiB, 1, ring)
            store.put("k%d" % i, b"v")
            store.clear()
            store.put("k%d" % i, b"v")
            store.close()
        self.assertEqual(self.client.list(prefix=BASE_PREFIX), [])

    # A reader inside a get when the writer closes keeps its bytes: the
    # delete takes the key, the pin keeps the object until it is released.
    def test_close_while_a_reader_reads(self):
        ring = SingleWriterShmRingBuffer(64 * KiB, create=True,
                                         socket_path=self.daemon.socket_path)
        store = ShmBrokerObjectStorage(16 * KiB, 1, ring)
        self.addCleanup(store.close)
        address, monotonic_id = store.put("k", b"z" * 5000)
        reader = ShmBrokerObjectStorage.create_from_handle(store.handle())
        self.addCleanup(reader.close)
        pin = reader.ring_buffer.client.get("k")
        store.close()
        self.assertIn(b"z" * 5000, bytes(pin.view))
        self.assertFalse(self.client.contains("k"))
        pin.release()

    def run_writer(self, script):
        """Run a writer script (argv: package dir, socket) to its end; its
        stdout, which it may hand to a child it leaves running."""
        with tempfile.TemporaryFile() as out:
            child = subprocess.run([sys.executable, "-c", script, PACKAGE_DIR,
                                    self.daemon.socket_path], stdout=out, timeout=60)
            out.seek(0)
            return child.returncode, out.read().decode()

    def assert_cleaned(self, keys):
        wait_until(lambda: not {o["key"] for o in self.client.list(prefix="")} & set(keys),
                   "the guard to delete the killed writer's objects %r" % (keys,))

    # A writer killed right after the daemon committed its object, before
    # the store's put returned: the guard knows of the object all the same.
    def test_killed_between_commit_and_return(self):
        rc, _ = self.run_writer(KILLED_AFTER_COMMIT)
        self.assertEqual(rc, -signal.SIGKILL)
        self.assert_cleaned(["first", "second"])

    # An unnamed ring's base is its own: the guard deletes it with the
    # killed writer's objects.
    def test_killed_unnamed_writer_leaves_no_base(self):
        rc, _ = self.run_writer(KILLED)
        self.assertEqual(rc, -signal.SIGKILL)
        self.assert_cleaned(["first", "second"])
        wait_until(lambda: self.client.list(prefix=BASE_PREFIX) == [],
                   "the guard to delete the killed writer's base")

    # A guard that was killed is replaced, and its replacement is told of
    # every object the writer still has, not only of those put after.
    def test_guard_killed_then_writer_killed(self):
        rc, _ = self.run_writer(GUARD_KILLED)
        self.assertEqual(rc, -signal.SIGKILL)
        self.assert_cleaned(["first", "second", "third"])

    # The pairs of a killed writer's objects, which its guard deleted, name
    # nothing once the ring's next writer puts new objects where they were
    # (the daemon used to hand their chunk ids out again): a reader that
    # still holds them gets vLLM's ValueError, not the new objects' bytes.
    def test_pairs_of_a_killed_writer_stay_stale(self):
        name = "shmb-stale-%d" % os.getpid()
        with tempfile.TemporaryFile() as out:
            rc = subprocess.run([sys.executable, "-c", NAMED_KILLED, PACKAGE_DIR,
                                 self.daemon.socket_path, name], stdout=out,
                                timeout=60).returncode
            out.seek(0)
            old = [int(n) for n in out.read().split()]
        self.assertEqual(rc, -signal.SIGKILL)
        old_pairs = [tuple(old[0:2]), tuple(old[2:4])]
        self.assert_cleaned(["first", "second"])
        ring = SingleWriterShmRingBuffer(64 * KiB, name=name, create=True,
                                         socket_path=self.daemon.socket_path)
        writer = ShmBrokerObjectStorage(16 * KiB, 2, ring)
        self.addCleanup(writer.close)
        reader = ShmBrokerObjectStorage.create_from_handle(writer.handle())
        self.addCleanup(reader.close)
        new_pairs = [writer.put("new-%d" % i, b"n%d" % i * 50) for i in range(2)]
        self.assertEqual([reader.get(*p) for p in new_pairs], [b"n0" * 50, b"n1" * 50])
        self.assertFalse(set(new_pairs) & set(old_pairs), (new_pairs, old_pairs))
        for pair in old_pairs:
            with self.assertRaises(ValueError) as cm:
                reader.get(*pair)
            self.assertIn("has been modified or is invalid", str(cm.exception))

    # A child the writer forked, alive after the writer was killed, does not
    # keep the guard from seeing the writer's end.
    def test_forked_child_outlives_killed_writer(self):
        rc, out = self.run_writer(FORKS_THEN_KILLED)
        child = int(out.split()[0])
        self.addCleanup(os.kill, child, signal.SIGKILL)
        self.assertEqual(rc, -signal.SIGKILL)
        os.kill(child, 0)  # still there
        self.assert_cleaned(["first"])

    # A store dropped without close(), as vLLM's ring is dropped, leaves no
    # object awaiting reads, no guard process and no descriptor behind.
    def test_dropped_store(self):
        fds = len(os.listdir("/proc/self/fd"))
        guards = []
        for i in range(3):
            ring = SingleWriterShmRingBuffer(64 * KiB, create=True,
                                             socket_path=self.daemon.socket_path)
            store = ShmBrokerObjectStorage(16 * KiB, 2, ring)
            store.put("dropped-%d" % i, b"d" * 6000)
            guards.append(store._guard[2])
            del store, ring
            gc.collect()
        self.assertEqual(self.client.list(prefix="dropped-"), [])
        self.assertEqual([g.returncode for g in guards], [0, 0, 0])
        self.assertEqual(len(os.listdir("/proc/self/fd")), fds)



class GuardTest(unittest.TestCase):
    """The guard process on its own, fed as a store feeds it."""

    # Malformed lines are skipped, thousands of objects that are gone are
    # pruned, and at the end of input (no clean close) the object still
    # there is deleted.
    def test_guard_input(self):
        with shmbroker.spawn_daemon(256 * KiB) as d, shmbroker.Client(d.socket_path) as c:
            offset = c.put("real", b"r" * 100, readers=1)
            chunk_id, _key = c.object_header(offset, committed=True)
            code = ("import sys; sys.path.insert(0, sys.argv[1]); from shmbroker.vllm import "
                    "_guard_main; _guard_main(sys.argv[2], '')")
            guard = subprocess.Popen([sys.executable, "-c", code, PACKAGE_DIR, d.socket_path],
                                     stdin=subprocess.PIPE)
            self.addCleanup(guard.kill)
            lines = [b"P x y 00\n", b"P 1 2 not-hex\n", b"junk\n"]
            lines += [b"P %d %d %s\n" % (offset + 64 * (i + 1), i, ("gone-%d" % i).encode().hex()
                                           .encode()) for i in range(5000)]
            lines.append(b"P %d %d %s\n" % (offset, chunk_id, b"real".hex().encode()))
            guard.stdin.write(b"".join(lines))
            guard.stdin.close()
            self.assertEqual(guard.wait(60), 0)
            self.assertFalse(c.contains("real"))


def wait_until(predicate, what, timeout=30.0):
    """Poll predicate until true; fail naming what was awaited otherwise."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("Timed out waiting for %s." % what)
        time.sleep(0.01)


if __name__ == "__main__":
    unittest.main()
