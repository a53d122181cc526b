# SPDX-License-Identifier: Apache-2.0
"""The vLLM store drop-in's usual put attacked as a hostile client and a
careless caller would: the straight publish into the arena held
(Client._publish_held), the look for evicted objects only after the ring's
start moved (_prune_reclaimed), and the proof from a key's home entry that
no other client committed the key (Catalog.absent). Each test names what
must hold whatever the other side does."""

import random
import threading
import unittest
import unittest.mock
import uuid

import support
import shmbroker
from shmbroker import _vllm_index
from shmbroker import vllm
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer

MiB = 1024 * 1024


class AbsentAgainstTheDaemonTest(support.DaemonTest):
    """Catalog.absent against the daemon's own table: entries inserted past
    their home, moved back by deletions (backward shift), under another
    client's deletes and puts running at the same time."""

    DAEMON_SIZE = "4M"
    DAEMON_ARGS = ("--max-objects", "48")

    # A committed key is never proven absent: not after deletions moved its
    # entry back towards its home, nor while another client keeps deleting
    # and putting keys whose entries share its probe.
    def test_committed_key_never_proven_absent(self):
        cat = self.c._catalog
        self.assertIsNotNone(cat)
        rng = random.Random(5)
        keys = ["k%d" % i for i in range(40)]
        for key in keys:
            self.c.put(key, b"v")
        live = set(keys)
        for _ in range(4):
            for key in rng.sample(sorted(live), 10):
                self.c.delete(key)
                live.discard(key)
                for other in live:
                    self.assertFalse(cat.absent(other.encode()), other)
                    self.assertIs(self.c._listed(other), True, other)
            for key in keys:
                if key not in live:
                    self.c.put(key, b"w")
                    live.add(key)
        # The same while another client churns the table under the look.
        other = self.d.client(name="churn")
        self.addCleanup(other.close)
        stable = sorted(live)[:20]
        churn = sorted(live)[20:]
        stop = threading.Event()
        errors = []

        def run():
            try:
                while not stop.is_set():
                    for key in churn:
                        other.delete(key)
                    for key in churn:
                        other.put(key, b"c")
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        t = threading.Thread(target=run)
        t.start()
        try:
            for _ in range(300):
                for key in stable:
                    self.assertFalse(cat.absent(key.encode()), key)
        finally:
            stop.set()
            t.join(30)
        self.assertEqual(errors, [])


class StoreAttackTest(unittest.TestCase):
    def make_store(self, buffer_size=16 * MiB, n_readers=1):
        ring = SingleWriterShmRingBuffer(buffer_size, name="shmb-att-%s" % uuid.uuid4().hex[:12],
                                         create=True)
        store = ShmBrokerObjectStorage(max_object_size=4 * MiB, n_readers=n_readers,
                                       ring_buffer=ring)
        self.addCleanup(store.close)
        return store

    # A hostile client that keeps writing the segment header's ring_start
    # (the daemon's mirror of where the oldest chunk is) back to one value
    # makes every put believe that nothing was evicted since the last (so
    # does a ring that comes round to the same start between two puts).
    # The writer's index must still let go of what the daemon evicted: it
    # may not grow with every put for as long as the store lives. The
    # hostile is emulated as one that wins every race: each look at the
    # word finds the value it froze.
    def test_frozen_ring_start_does_not_grow_the_index(self):
        store = self.make_store(buffer_size=2 * MiB, n_readers=0)
        store.put("first", b"x" * 16384)
        client = store.ring_buffer.client
        frozen = _vllm_index._RING_START.unpack_from(client._mv,
                                                     _vllm_index._RING_START_AT)

        class Frozen:
            @staticmethod
            def unpack_from(buf, offset=0):
                return frozen

        with unittest.mock.patch.object(_vllm_index, "_RING_START", Frozen):
            for i in range(1000):
                store.put("item_%d" % i, b"x" * 16384)
        alive = sum(1 for key in list(store._objects) if store._alive(key))
        self.assertLess(alive, 200)  # the ring holds about 128 such objects
        self.assertLess(len(store.key_index), alive + 100)
        self.assertLess(len(store.id_index), alive + 100)

    # A put cut short right after its chunk was published (KeyboardInterrupt
    # before the store recorded it) leaves an object of the writer's that
    # the daemon committed: the store must know it as its own. Else
    # is_cached() says no while every later put of the key is refused as
    # "already exists", get_cached() raises KeyError, and close() leaves the
    # object (awaiting reads no reader is told of).
    def test_put_interrupted_after_publish_is_known(self):
        store = self.make_store()
        store.put("warm", b"w")
        real = store._put_made
        calls = []

        def interrupted(*args):
            calls.append(args)
            if len(calls) == 1:
                raise KeyboardInterrupt
            return real(*args)

        store._put_made = interrupted
        with self.assertRaises(KeyboardInterrupt):
            store.put("k", b"mine")
        del store._put_made
        self.assertTrue(store.is_cached("k"))
        pair = store.get_cached("k")
        self.assertEqual(store.get(*pair), b"mine")
        self.assertEqual(store.key_index["k"], pair)
        with self.assertRaisesRegex(ValueError, "already exists"):
            store.put("k", b"again")
        self.assertIn("k", store._objects)  # close() deletes it
        self.assertEqual(store.get(*store.put("after", b"a")), b"a")

    # The connection lost after the put's chunk was published (here while
    # the store settles its base): put() reconnects and goes on, as it does
    # for any lost connection, and returns the pair of the object it made,
    # not "already exists" for its own object; is_cached() and get_cached()
    # agree with it.
    def test_connection_lost_after_publish_returns_the_put(self):
        store = self.make_store()
        store.put("warm", b"w")
        real = store._settle_base
        calls = []

        def lost(*args):
            calls.append(args)
            if len(calls) == 1:
                store.ring_buffer.client._disconnect(keep_map=True)
                raise shmbroker.ConnectionLost("ECONNRESET", "lost under the put")
            return real(*args)

        store._settle_base = lost
        pair = store.put("k", b"mine")
        del store._settle_base
        self.assertEqual(store.get(*pair), b"mine")
        self.assertTrue(store.is_cached("k"))
        self.assertEqual(store.get_cached("k"), pair)
        with self.assertRaisesRegex(ValueError, "already exists"):
            store.put("k", b"again")

    # A key given as UTF-8 bytes (check_key takes either) is the store's key
    # as its text: the put, is_cached, get_cached and touch of either
    # spelling name one object, and looks at the writer's objects (a put's
    # prune, close()) do not fail on it.
    def test_bytes_key(self):
        store = self.make_store()
        pair = store.put(b"bk", b"v")
        self.assertTrue(store.is_cached(b"bk"))
        self.assertTrue(store.is_cached("bk"))
        self.assertEqual(store.get_cached(b"bk"), pair)
        self.assertEqual(store.get_cached("bk"), pair)
        store.touch(b"bk")
        # A key that is no text names nothing stored, as in vLLM's store.
        self.assertFalse(store.is_cached(b"\xff"))
        self.assertFalse(store.is_cached(123))
        with self.assertRaises(KeyError):
            store.get_cached(b"\xff")
        with self.assertRaisesRegex(ValueError, "already exists"):
            store.put("bk", b"w")
        store.free_unused()  # looks at every object from the oldest
        for i in range(5):
            store.put("k%d" % i, b"x")
        store.free_unused()
        self.assertEqual(store.get(*pair), b"v")
        store.close()


    # Another client moves the published end of the writer's arena to a
    # place inside it: the writer's next publish fails its compare-and-swap
    # and lays the chunk out again in a new arena. The chunk it had laid out
    # in the old one must not be folded by the moved end (the key would be
    # committed twice: the second refused, the put lost, an object left that
    # the writer does not know). Every put made after it reads back.
    def test_moved_published_end_does_not_commit_a_chunk_twice(self):
        from shmbroker import _arena
        store = self.make_store()
        hostile = shmbroker.Client(store.ring_buffer.socket_path)
        self.addCleanup(hostile.close)
        store.put("warm", b"w")
        client = store.ring_buffer.client
        arena = client._arena
        self.assertGreater(arena.size, 0)
        at = arena.offset - 64 + _arena.PUBLISHED_AT
        inside = arena.offset + arena.size // 2
        hostile._mv[at:at + 8] = inside.to_bytes(8, "little")
        pairs = {"b%d" % i: store.put("b%d" % i, "value-b%d" % i) for i in range(4)}
        self.assertEqual(len(set(pairs.values())), 4)
        for key, pair in pairs.items():
            self.assertEqual(store.get(*pair), "value-" + key)
            self.assertTrue(store.is_cached(key))


class RefusedPutPairTest(unittest.TestCase):
    # A put the daemon refused (another client's commit of the key landed
    # between the writer's look at the catalog and its publish) was the
    # only chunk of the writer's fresh arena. Its pair had been handed out;
    # the arena, given back empty, must not give its chunk id to the next
    # arena at the same place: the next put's object would then have the
    # very same pair, and a reader holding the refused put's pair would get
    # that other object's value instead of vLLM's ValueError.
    def test_refused_put_pair_never_names_the_next_object(self):
        ring = SingleWriterShmRingBuffer(16 * MiB, name="shmb-att-%s" % uuid.uuid4().hex[:12],
                                         create=True)
        store = ShmBrokerObjectStorage(max_object_size=4 * MiB, n_readers=1, ring_buffer=ring)
        self.addCleanup(store.close)
        other = shmbroker.Client(ring.socket_path)
        self.addCleanup(other.close)
        other.put_nowait("theirs-first", b"o")  # its own arena, older than the writer's next
        other.sync()

        class Racing(vllm.PickleSerde):
            def serialize(self, value):
                if value == "race":
                    other.put_nowait("k", b"theirs")
                    other.sync()
                return super().serialize(value)

        store.ser_de = Racing()
        client = store.ring_buffer.client
        store.put("warm", b"w")
        i = 0
        while client._arena_due is None and i < 10000:  # until a fresh arena is due
            store.put("fill_%d" % i, b"x" * 1000)
            i += 1
        refused = store.put("k", "race")
        self.assertFalse(store.is_cached("k"))  # the refusal learnt
        for j in range(4):
            pair = store.put("next_%d" % j, "value-%d" % j)
            self.assertNotEqual(pair, refused)
            self.assertEqual(store.get(*pair), "value-%d" % j)
        with self.assertRaisesRegex(ValueError, "modified or is invalid"):
            store.get(*refused)
        self.assertEqual(other.read("k"), b"theirs")
