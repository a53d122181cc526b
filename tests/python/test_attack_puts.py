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
from shmbroker import _vllm_index
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
