# SPDX-License-Identifier: Apache-2.0
"""The vLLM store drop-in against other clients and careless callers: a
put whose commit the daemon refuses (another client took the key in
between) is not handed out again and adds no reads to the other client's
object; monotonic ids grow put after put whichever way a put goes; the
writer's threads may put at once, and a child made by fork() while one
of them held the ring's lock may use the store; a scribbled size in a
chunk header costs a round trip, not the value."""

import os
import signal
import struct
import threading
import time
import unittest
import uuid

import support  # noqa: F401  (puts the package on the path)
import shmbroker
from shmbroker import _protocol as P
from shmbroker import vllm
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer

MiB = 1024 * 1024


class HostileStoreTest(unittest.TestCase):
    def make_store(self, buffer_size=16 * MiB, n_readers=1):
        ring = SingleWriterShmRingBuffer(buffer_size, name="shmb-test-%s" % uuid.uuid4().hex[:12],
                                         create=True)
        store = ShmBrokerObjectStorage(max_object_size=4 * MiB, n_readers=n_readers,
                                       ring_buffer=ring)
        self.addCleanup(store.close)
        return store

    # Another client commits the key between the writer's look at the
    # catalog and its commit, which the daemon then refuses without a reply.
    # vLLM's sender asks is_cached() and, on True, get_cached(): neither may
    # take the key for the writer's (the pair would name nothing, and the
    # hand-out's touch would give the other client's object reads that no
    # reader will ever count, so that it could never be evicted). A put
    # that nothing races is cached (test_vllm_mapped's test_no_round_trip
    # checks that is_cached right after a put waits for no reply).
    def test_refused_commit_not_handed_out(self):
        store = self.make_store()
        other = shmbroker.Client(store.ring_buffer.socket_path)
        self.addCleanup(other.close)
        store.put("warm", b"w")

        class Racing(vllm.PickleSerde):
            def serialize(self, value):
                if value == "race":
                    other.put("k", b"theirs")
                return super().serialize(value)

        store.ser_de = Racing()
        store.put("free", b"f")
        self.assertTrue(store.is_cached("free"))
        store.put("k", "race")
        self.assertFalse(store.is_cached("k"))
        self.assertNotIn("k", store.key_index)
        with self.assertRaises(KeyError):
            store.get_cached("k")
        store.touch("k")
        self.assertEqual(other.list("k")[0]["readers"], 0)
        self.assertEqual(other.read("k"), b"theirs")
        self.assertTrue(store.is_cached("free"))

    # The same race, with the writer's hand-out asked first (get_cached
    # without is_cached, and the writer's touch): neither touches the other
    # client's object.
    def test_refused_commit_not_touched(self):
        store = self.make_store()
        other = shmbroker.Client(store.ring_buffer.socket_path)
        self.addCleanup(other.close)
        store.put("warm", b"w")

        class Racing(vllm.PickleSerde):
            def serialize(self, value):
                if isinstance(value, str) and value.startswith("race"):
                    other.put(value, b"theirs")
                return super().serialize(value)

        store.ser_de = Racing()
        store.put("race1", "race1")
        store.touch("race1")
        store.put("race2", "race2")
        with self.assertRaises(KeyError):
            store.get_cached("race2")
        self.assertEqual(other.list("race1")[0]["readers"], 0)
        self.assertEqual(other.list("race2")[0]["readers"], 0)

    # Monotonic ids grow put after put, as vLLM's do, when puts through
    # the writer's arena and puts too large for one (alloc and commit, a
    # newer chunk id) alternate, and after clear(), whose first put may be
    # one of those: never smaller than the one before, never negative. Each
    # pair still reads its own value.
    def test_ids_grow_around_large_puts(self):
        store = self.make_store()
        reader = ShmBrokerObjectStorage.create_from_handle(store.handle())
        self.addCleanup(reader.close)
        big = 3 * MiB  # more than an arena may hold (1/8 of the data area)
        for phase in ("start", "after clear"):
            values = [b"a" * 100, b"B" * big, b"c" * 100, b"d" * 200, b"E" * big, b"f" * 100]
            pairs = [store.put("%s %d" % (phase, i), v) for i, v in enumerate(values)]
            ids = [p[1] for p in pairs]
            self.assertEqual(ids, sorted(set(ids)), (phase, pairs))
            self.assertGreaterEqual(ids[0], 0, (phase, pairs))
            for pair, value in zip(pairs, values):
                self.assertEqual(reader.get(*pair), value)
            store.clear()
            store.put("big first %s" % phase, b"G" * big)

    # Two threads of the writer put at once (they share its connection): the
    # second waits for the first, as before puts went through the arena;
    # its look for another client's object of the key raised EBUSY while
    # the first one's put was sending. The first put is held in its publish
    # (inside the client's lock, where its send was before puts published
    # their chunks) until the second has tried (bounded: with the ring's
    # lock the second waits for the first, which then goes on after a
    # second).
    def test_threads_share_the_writer(self):
        store = self.make_store()
        store.put("warm", b"w")
        client = store.ring_buffer.client
        real_publish = client._publish
        inside = threading.Event()
        tried = threading.Event()
        errors = []

        def publish(*args):
            if threading.current_thread() is first and not inside.is_set():
                inside.set()
                tried.wait(1.0)
            return real_publish(*args)

        def put(key):
            try:
                store.put(key, key)
            except Exception as e:  # noqa: BLE001  (any error is the finding)
                errors.append(e)
            finally:
                if key == "second":
                    tried.set()

        client._publish = publish
        first = threading.Thread(target=put, args=("first",))
        first.start()
        self.assertTrue(inside.wait(20))
        second = threading.Thread(target=put, args=("second",))
        second.start()
        first.join(20)
        second.join(20)
        self.assertEqual(errors, [])
        reader = ShmBrokerObjectStorage.create_from_handle(store.handle())
        self.addCleanup(reader.close)
        for key in ("first", "second"):
            self.assertEqual(reader.get(*store.key_index[key]), key)

    # fork() while another thread of the writer holds the ring's lock (in
    # the middle of a put, say): that thread does not exist in the child,
    # whose put and get waited for the lock for ever. The child's own puts
    # and gets work (on a connection of its own); the parent's go on.
    def test_fork_while_a_thread_holds_the_ring(self):
        store = self.make_store()
        pair = store.put("before", b"parent's")
        held = threading.Event()
        release = threading.Event()

        def hold():
            with store.ring_buffer.lock:
                held.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        self.assertTrue(held.wait(20))
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                signal.alarm(30)  # bound a child that would wait for ever
                child_pair = store.put("child", b"child's")
                if store.get(*child_pair) == b"child's" and store.get(*pair) == b"parent's":
                    status = 0
            finally:
                os._exit(status)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                time.sleep(0.01)
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                self.fail("the child's put waited for a lock held by a thread of its parent")
        finally:
            release.set()
            holder.join(20)
        self.assertTrue(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status)
        self.assertEqual(store.get(*store.put("after", b"a")), b"a")

    # A read-write client scribbles the size in an object's chunk header
    # (smaller, larger): a reader's get in place finds the payload's
    # lengths wrong and asks the daemon, whose pin knows the size, and
    # returns the value put, as for any other header field scribbled
    # (it raised the serde's error).
    def test_scribbled_size(self):
        store = self.make_store()
        reader = ShmBrokerObjectStorage.create_from_handle(store.handle())
        self.addCleanup(reader.close)
        scribbler = shmbroker.Client(store.ring_buffer.socket_path)
        self.addCleanup(scribbler.close)
        for i, delta in enumerate((-8, 4096, -1)):
            key = "sized %d" % i
            value = ["a value", i] * 20
            pair = store.put(key, value)
            store.ring_buffer.client.sync()
            offset = store._objects[key][0]
            chunk = offset - P.align64(P.CHUNK_HEADER_SIZE + len(key.encode()))
            size = P.CHUNK_HEADER.unpack_from(scribbler._mv, chunk)[7]
            struct.pack_into("=Q", scribbler._mv, chunk + 32, size + delta)
            self.assertEqual(reader.get(*pair), value, delta)

    # The ring comes round: an arena may then lie across the base's place
    # (where the first put after clear() was), its first objects before it
    # and the next after it. Ids still grow put after put (the objects
    # before the base's place got larger ids than those after it), and
    # each pair still reads its own value.
    def test_ids_grow_in_an_arena_across_the_base(self):
        store = self.make_store(buffer_size=4 * MiB, n_readers=0)
        reader = ShmBrokerObjectStorage.create_from_handle(store.handle())
        self.addCleanup(reader.close)
        for i in range(100):
            store.put("before clear %d" % i, b"b" * 5000)
        store.clear()  # the next put, the base, lies inside the ring
        pairs, across = [], None
        for i in range(4000):
            key = "k%d" % i
            pairs.append((store.put(key, key.encode() * 500), key))
            if i and across is None:
                (prev, prev_id), (now, now_id) = store._objects["k%d" % (i - 1)], store._objects[key]
                if prev_id == now_id and prev < store._base[0] <= now:
                    across = i
            if across is not None and i >= across + 20:
                break
        self.assertIsNotNone(across, "no arena lay across the base's place in 4000 puts")
        ids = [pair[1] for pair, _ in pairs]
        self.assertEqual(ids, sorted(set(ids)))
        for pair, key in pairs[-40:]:
            self.assertEqual(reader.get(*pair), key.encode() * 500)


if __name__ == "__main__":
    unittest.main()
