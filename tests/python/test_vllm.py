# SPDX-License-Identifier: Apache-2.0
"""The vLLM drop-in (shmbroker.vllm): every behaviour vLLM's own tests check of
SingleWriterShmObjectStorage (tests/distributed/test_shm_storage.py, the shm
eviction test of tests/multimodal/test_cache.py), written anew against real
daemons, plus what shmbroker adds: many writers, a killed reader releasing
its pin, a picklable handle, and the ring finding or starting its daemon.

Rings are made as vLLM makes them, with $SHMBROKER_SOCKET pointing where no
daemon runs, so that each writer starts (and stops) a private shmbrokerd of
the ring's size; RingModesTest also runs them on a shared daemon.
"""

import gc
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import shmbroker  # noqa: E402
from shmbroker import vllm  # noqa: E402
from shmbroker.vllm import (ShmBrokerObjectStorage, SingleWriterShmRingBuffer,  # noqa: E402
                            named_socket_path)

import vllm_helpers  # noqa: E402

try:
    import numpy as np
except ImportError:
    np = None

MiB = 1024 * 1024


class VllmTestCase(unittest.TestCase):
    """$SHMBROKER_SOCKET points where nothing listens, so writers' rings start
    private daemons; stores made by make_store() are closed at the end."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="shmb-vllm-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        env = mock.patch.dict(os.environ, {"SHMBROKER_SOCKET": os.path.join(self.tmp, "none.sock")})
        env.start()
        self.addCleanup(env.stop)

    def make_store(self, buffer_size=100 * 1024, max_object_size=10 * 1024, n_readers=2,
                   **kw):
        ring = SingleWriterShmRingBuffer(data_buffer_size=buffer_size, create=True,
                                         name=kw.pop("name", None))
        store = ShmBrokerObjectStorage(max_object_size=max_object_size, n_readers=n_readers,
                                       ring_buffer=ring, **kw)
        self.addCleanup(store.close)
        return store

    def reader_of(self, store):
        reader = ShmBrokerObjectStorage.create_from_handle(store.handle())
        self.addCleanup(reader.close)
        return reader

    @staticmethod
    def fill(store, start=0, stop=1000):
        """put items start.. until MemoryError (as vLLM's tests do); the
        stored (key, value, address, id)."""
        stored = []
        try:
            for i in range(start, stop):
                key, value = "item_%d" % i, ("data_%d" % i) * 100
                address, monotonic_id = store.put(key, value)
                stored.append((key, value, address, monotonic_id))
        except MemoryError:
            pass
        return stored

    def awaited(self, store, key):
        """The reads the daemon says the object of key still awaits."""
        for obj in store.ring_buffer.client.list(prefix=key):
            if obj["key"] == key:
                return obj["readers"]
        return None

    def assert_awaited(self, store, key, want):
        """The object of key comes to await want reads: a reader's get
        counts its read by a request it does not wait for, which the daemon
        handles a moment later."""
        deadline = time.monotonic() + 10
        while self.awaited(store, key) != want and time.monotonic() < deadline:
            time.sleep(0.002)
        self.assertEqual(self.awaited(store, key), want)


class StorageTest(VllmTestCase):
    """vLLM's test_shm_storage.py behaviours, one test each."""

    # put then get returns the value, and the writer's indexes hold the pair.
    def test_minimal_put_get_cycle(self):
        store = self.make_store()
        reader = self.reader_of(store)
        value = {"name": "Alice", "scores": [95, 87, 92], "blob": b"\x00\x01" * 100}
        address, monotonic_id = store.put("test_key", value)
        self.assertEqual(store.key_index["test_key"], (address, monotonic_id))
        self.assertEqual(store.id_index[monotonic_id], "test_key")
        self.assertEqual(reader.get(address, monotonic_id), value)
        self.assertEqual(store.get(address, monotonic_id), value)

    # A second put of a key is refused with vLLM's text; the first value stays.
    def test_put_same_key_twice(self):
        store = self.make_store()
        address, monotonic_id = store.put("duplicate_key", "first value")
        with self.assertRaises(ValueError) as cm:
            store.put("duplicate_key", "second value")
        self.assertEqual(str(cm.exception), "Key 'duplicate_key' already exists in the storage.")
        self.assertEqual(store.get(address, monotonic_id), "first value")

    # An object larger than max_object_size is refused with vLLM's text.
    def test_large_object_rejection(self):
        store = self.make_store()
        with self.assertRaises(ValueError) as cm:
            store.put("large_key", "x" * (store.max_object_size + 100))
        self.assertRegex(str(cm.exception), r"^Serialized object size \(\d+ bytes\) exceeds max "
                         r"object size \(10240 bytes\)$")
        self.assertFalse(store.is_cached("large_key"))

    # The buffer fills (MemoryError with vLLM's text and the daemon's blocker),
    # every item is readable, and once each was read n_readers times (by
    # two readers) the next puts find room.
    def test_buffer_overflow_and_cleanup(self):
        store = self.make_store()
        readers = [self.reader_of(store), self.reader_of(store)]
        stored = self.fill(store)
        self.assertGreater(len(stored), 10)
        with self.assertRaises(MemoryError) as cm:
            store.put("one_more", "x" * 1000)
        self.assertTrue(str(cm.exception).startswith(
            "Not enough space in the data buffer, try calling free_buf() to free up space"))
        self.assertIn("'item_0' blocks reclaim", str(cm.exception))
        for key, value, address, monotonic_id in stored:
            for r in readers:
                self.assertEqual(r.get(address, monotonic_id), value)
        more = self.fill(store, len(stored), len(stored) + 10)
        self.assertEqual(len(more), 10)
        for key, value, address, monotonic_id in more:
            self.assertEqual(readers[0].get(address, monotonic_id), value)
        self.assertFalse(store.is_cached("item_0"))  # evicted for the newer ones

    # An object not yet read blocks reclaim: the next put fails although every
    # newer object was read; once it is read, puts go on.
    def test_blocking_unread_object(self):
        store = self.make_store()
        reader = self.reader_of(store)
        stored = self.fill(store)
        for key, value, address, monotonic_id in stored[1:]:
            for _ in range(store.n_readers):
                self.assertEqual(reader.get(address, monotonic_id), value)
        with self.assertRaises(MemoryError) as cm:
            store.put("item_%d" % len(stored), "x" * 500)
        self.assertIn("'item_0' blocks reclaim (pins=0, awaited reads=2)", str(cm.exception))
        key, value, address, monotonic_id = stored[0]
        for _ in range(store.n_readers):
            self.assertEqual(reader.get(address, monotonic_id), value)
        more = self.fill(store, len(stored), len(stored) + 10)
        self.assertEqual(len(more), 10)

    # Addresses that hold nothing, or another id, are refused with vLLM's text.
    def test_invalid_get_operations(self):
        store = self.make_store()
        reader = self.reader_of(store)
        with self.assertRaises(ValueError) as cm:
            reader.get(99999, 1)
        self.assertEqual(str(cm.exception),
                         "Data for address:id '99999:1' has been modified or is invalid.")
        address, monotonic_id = store.put("test", "value")
        for bad in ((address, monotonic_id + 100), (address + 64, monotonic_id), (-1, 0),
                    (10 ** 12, 0)):
            with self.assertRaises(ValueError) as cm:
                reader.get(*bad)
            self.assertEqual(str(cm.exception), "Data for address:id '%d:%d' has been modified "
                             "or is invalid." % bad)
        self.assertEqual(reader.get(address, monotonic_id), "value")

    # clear() empties the writer's indexes and deletes its objects, and the
    # store takes new objects (keys reused included).
    def test_clear_storage(self):
        store = self.make_store()
        reader = self.reader_of(store)
        pairs = [store.put("item_%d" % i, "value_%d" % i) for i in range(5)]
        store.clear()
        self.assertEqual(len(store.key_index), 0)
        self.assertEqual(len(store.id_index), 0)
        self.assertEqual(store.ring_buffer.client.list(prefix="item_"), [])
        for address, monotonic_id in pairs:
            with self.assertRaises(ValueError):
                reader.get(address, monotonic_id)
        address, monotonic_id = store.put("item_0", "new_value")
        self.assertIn("item_0", store.key_index)
        self.assertEqual(reader.get(address, monotonic_id), "new_value")

    # A writer given a reader_lock counts its own gets as reads, as vLLM's
    # does (its test_blocking_unread_object reads through the writer).
    def test_writer_get_with_lock_counts(self):
        store = self.make_store(reader_lock=threading.Lock())
        address, monotonic_id = store.put("k", [1, 2, 3])
        self.assertEqual(store.get(address, monotonic_id), [1, 2, 3])
        self.assert_awaited(store, "k", 1)
        self.assertEqual(store.get(address, monotonic_id), [1, 2, 3])
        self.assert_awaited(store, "k", 0)

    # The writer's own get counts no read (vLLM's writer reads without the
    # reader lock); a reader's does.
    def test_writer_get_counts_no_read(self):
        store = self.make_store()
        reader = self.reader_of(store)
        address, monotonic_id = store.put("k", [1, 2, 3])
        for _ in range(3):
            self.assertEqual(store.get(address, monotonic_id), [1, 2, 3])
        self.assert_awaited(store, "k", 2)
        reader.get(address, monotonic_id)
        self.assert_awaited(store, "k", 1)

    # get_cached and the writer's touch each hand the object out once more
    # (n_readers awaited reads); touching an absent key does nothing.
    def test_get_cached_and_writer_touch(self):
        store = self.make_store(n_readers=3)
        pair = store.put("k", "v")
        self.assert_awaited(store, "k", 3)
        self.assertEqual(store.get_cached("k"), pair)
        self.assert_awaited(store, "k", 6)
        store.touch("k")
        self.assert_awaited(store, "k", 9)
        store.touch("absent")
        with self.assertRaises(KeyError):
            store.get_cached("absent")

    # A reader's touch counts one read only of an object this reader has read
    # before (vLLM: only when the object is not new).
    def test_reader_touch(self):
        store = self.make_store(n_readers=1)
        reader = self.reader_of(store)
        address, monotonic_id = store.put("k", "v")
        reader.touch("k", address, monotonic_id)  # new: the get will be its read
        self.assert_awaited(store, "k", 1)
        reader.get(address, monotonic_id)
        self.assert_awaited(store, "k", 0)
        store.touch("k")
        store.get_cached("k")
        self.assert_awaited(store, "k", 2)
        reader.touch("k", address, monotonic_id)
        self.assert_awaited(store, "k", 1)
        reader.get(address, monotonic_id)
        self.assert_awaited(store, "k", 0)
        reader.touch("k", address + 64, monotonic_id)  # nothing there: ignored
        self.assert_awaited(store, "k", 0)

    # is_cached asks the daemon: an object deleted behind the writer's back is
    # no longer cached, leaves key_index and id_index, and its key can be put again.
    def test_is_cached_asks_the_daemon(self):
        store = self.make_store()
        address, monotonic_id = store.put("k", "v")
        self.assertTrue(store.is_cached("k"))
        with shmbroker.Client(store.ring_buffer.socket_path) as other:
            other.delete("k")
        self.assertFalse(store.is_cached("k"))
        self.assertNotIn("k", store.key_index)
        self.assertNotIn(monotonic_id, store.id_index)
        self.assertEqual(store.get(*store.put("k", "w")), "w")

    # A serde of vLLM's shape (metadata, then a list of buffers) round-trips.
    # A put looks for evicted objects of the writer's only once the ring's
    # start moved (every eviction moves it): puts that evict nothing look at
    # no older object's header; the put after an eviction drops the evicted
    # keys from key_index and id_index without asking the daemon.
    def test_put_prunes_after_the_ring_start_moved(self):
        store = self.make_store(n_readers=1)
        reader = self.reader_of(store)
        pruned = []
        real = store._prune
        store._prune = lambda: (pruned.append(1), real())[1]
        pairs = [store.put("item_%d" % i, "x" * 1000) for i in range(8)]
        self.assertLessEqual(len(pruned), 1, "puts that evicted nothing looked for evictions")
        for pair in pairs:
            reader.get(*pair)  # read: each may be evicted now
        before = len(pruned)
        i = 8
        while "item_0" in store.key_index and i < 400:
            reader.get(*store.put("item_%d" % i, "x" * 1000))
            i += 1
        self.assertNotIn("item_0", store.key_index)
        self.assertNotIn(pairs[0][1], store.id_index)
        self.assertGreater(len(pruned), before)
        self.assertLess(len(pruned) - before, i - 8, "every put looked for evictions")

    def test_serde_of_vllm_shape(self):
        store = self.make_store(serde_class=vllm_helpers.PartsSerde)
        reader = self.reader_of(store)
        value = [b"abc", b"", b"x" * 1000]
        self.assertEqual(reader.get(*store.put("parts", value)), value)

    # reader_lock is accepted and changes nothing (readers need none).
    def test_reader_lock_ignored(self):
        store = self.make_store(reader_lock=threading.Lock())
        handle = store.handle()
        self.assertIsNotNone(handle.reader_lock)
        reader = ShmBrokerObjectStorage.create_from_handle(handle)
        self.addCleanup(reader.close)
        self.assertEqual(reader.get(*store.put("k", "v")), "v")


class EvictionOrderTest(VllmTestCase):
    """vLLM's tests/multimodal/test_cache.py shm eviction test, with the sender
    (P0) and receiver (P1) caches' calls spelt out, sizes in units of 16 KiB:
    a 15.2-unit buffer, a 6-unit max object."""

    UNIT = 16 * 1024

    def setUp(self):
        super().setUp()
        self.p0 = self.make_store(buffer_size=int(15.2 * self.UNIT),
                                  max_object_size=6 * self.UNIT, n_readers=1)
        self.p1 = self.reader_of(self.p0)

    def item(self, units):
        return bytes(units * self.UNIT)

    def sender(self, hashes, items):
        """P0's touch_sender_cache_item then get_and_update_item for each:
        an address ("addr", address, id) for a cached or stored item, else
        the item itself (the put failed)."""
        cached = [self.p0.is_cached(h) for h in hashes]
        for h in hashes:
            self.p0.touch(h)
        out = []
        for h, is_cached in zip(hashes, cached):
            if is_cached:
                out.append(("addr",) + self.p0.get_cached(h))
                continue
            try:
                out.append(("addr",) + self.p0.put(h, items[h]))
            except (ValueError, MemoryError):
                out.append(("item", items[h]))
        return out

    def receiver(self, hashes, out, items):
        """P1's touch_receiver_cache_item then get_and_update_item."""
        for h, o in zip(hashes, out):
            if o[0] == "addr":
                self.p1.touch(h, o[1], o[2])
        for h, o in zip(hashes, out):
            got = self.p1.get(o[1], o[2]) if o[0] == "addr" else o[1]
            self.assertEqual(got, items[h], h)

    # Request 1 fills the buffer; request 2 cannot add G, A being protected by
    # the sender's touch; request 3 evicts A (read as often as handed out),
    # adds G and H, and cannot add I because B, touched again, protects itself.
    def test_cache_eviction_shm(self):
        req1 = ["image_A", "image_B", "image_C"]
        items1 = {h: self.item(5) for h in req1}
        self.assertEqual([self.p0.is_cached(h) for h in req1], [False] * 3)
        self.receiver(req1, self.sender(req1, items1), items1)
        self.assertEqual(list(self.p0.key_index), req1)

        req2 = ["image_G", "image_A"]
        items2 = {"image_G": self.item(2), "image_A": items1["image_A"]}
        self.assertEqual([self.p0.is_cached(h) for h in req2], [False, True])
        out2 = self.sender(req2, items2)
        self.assertEqual(out2[0][0], "item")  # G did not fit
        self.assertEqual([self.p0.is_cached(h) for h in req2], [False, True])
        self.receiver(req2, out2, items2)
        self.assertEqual(list(self.p0.key_index), req1)

        req3 = ["image_G", "image_H", "image_I", "image_B"]
        items3 = {"image_G": self.item(2), "image_H": self.item(2), "image_I": self.item(2),
                  "image_B": items1["image_B"]}
        self.assertEqual([self.p0.is_cached(h) for h in req3], [False, False, False, True])
        out3 = self.sender(req3, items3)
        self.assertEqual([self.p0.is_cached(h) for h in req3], [True, True, False, True])
        self.receiver(req3, out3, items3)
        self.assertEqual(list(self.p0.key_index), ["image_B", "image_C", "image_G", "image_H"])


class PairsTest(VllmTestCase):
    """Addresses and ids count from the store's first object, as vLLM's
    count from its ring's start, on a private daemon and on a shared one."""

    def shared(self, size=1 * MiB):
        d = shmbroker.spawn_daemon(size)
        self.addCleanup(d.stop)
        return d

    # A new store's first put is (0, 0), and after clear() the next one is
    # (0, 0) again, though the daemon holds other clients' objects before,
    # between and after; readers (one made before the clear) read each.
    def test_zero_after_clear_on_a_shared_daemon(self):
        d = self.shared()
        with mock.patch.dict(os.environ, {"SHMBROKER_SOCKET": d.socket_path}):
            other = shmbroker.Client(d.socket_path)
            self.addCleanup(other.close)
            other.put("someone-else", b"x" * 3000)
            store = self.make_store()
            reader = self.reader_of(store)
            self.assertEqual(store.put("a", "A"), (0, 0))
            other.put("someone-else-2", b"y" * 5000)
            pair_b = store.put("b", "B")
            self.assertGreater(pair_b[0], 0)
            self.assertGreater(pair_b[1], 0)
            self.assertEqual(reader.get(*pair_b), "B")
            for i in range(5):
                store.put("item_%d" % i, "value_%d" % i)
            store.clear()
            self.assertEqual(len(store.ring_buffer.metadata), 0)
            other.put("someone-else-3", b"z" * 7000)
            self.assertEqual(store.put("new_item", "new_value"), (0, 0))
            self.assertEqual(store.key_index["new_item"], (0, 0))
            self.assertEqual(reader.get(0, 0), "new_value")
            late = self.reader_of(store)
            self.assertEqual(late.get(0, 0), "new_value")
            with self.assertRaises(ValueError):
                reader.get(*pair_b)

    # The base the pairs count from is an object of the daemon: evicted (or
    # deleted) it comes back with the writer's next put, and readers that saw
    # it go on meanwhile.
    def test_base_put_back(self):
        store = self.make_store()
        reader = self.reader_of(store)
        first = store.put("a", "A")
        self.assertEqual(reader.get(*first), "A")
        with shmbroker.Client(store.ring_buffer.socket_path) as c:
            bases = [o["key"] for o in c.list(prefix="shmbroker-vllm-base:")]
            self.assertEqual(len(bases), 1)
            c.delete(bases[0])
            self.assertEqual(reader.get(*first), "A")
            second = store.put("b", "B")
            self.assertTrue(c.contains(bases[0]))
        late = self.reader_of(store)
        self.assertEqual((late.get(*first), late.get(*second)), ("A", "B"))
        # get_cached, which hands a pair out again, puts it back too.
        with shmbroker.Client(store.ring_buffer.socket_path) as c:
            c.delete(bases[0])
            self.assertEqual(store.get_cached("a"), first)
            self.assertTrue(c.contains(bases[0]))

    # Writers sharing a ring name share the base: after one's clear(), the
    # next put of any of them is (0, 0), and the others' pairs follow.
    def test_clear_by_one_of_two_writers(self):
        name = "shmb-test-%s" % uuid.uuid4().hex[:12]
        w1 = self.make_store(name=name)
        w2 = self.make_store(name=name)
        reader = self.reader_of(w1)
        self.assertEqual(w1.put("a", "A"), (0, 0))
        w2.put("b", "B")
        w1.clear()
        self.assertEqual(w2.put("c", "C"), (0, 0))
        self.assertEqual(reader.get(0, 0), "C")
        pair_b = w2.key_index["b"]
        self.assertEqual(reader.get(*pair_b), "B")
        self.assertEqual(reader.get(*w1.put("d", "D")), "D")

    # A pair that get_cached hands out after another writer's clear(), and
    # before any put, resolves: its base is set anew, as a put's would be.
    def test_get_cached_after_the_other_writers_clear(self):
        name = "shmb-test-%s" % uuid.uuid4().hex[:12]
        w1 = self.make_store(name=name)
        w2 = self.make_store(name=name)
        reader = self.reader_of(w1)
        w1.put("a", "A")
        w2.put("b", "B")
        w1.clear()
        self.assertEqual(w2.get_cached("b"), (0, 0))
        self.assertEqual(reader.get(0, 0), "B")
        self.assertEqual(reader.get(*w2.put("c", "C")), "C")

    # Two unnamed stores sharing a daemon are two rings: each counts its
    # pairs from (0, 0), and one's clear() leaves the other's pairs valid.
    def test_unnamed_stores_on_one_daemon(self):
        daemon = shmbroker.spawn_daemon(1024 * 1024)
        self.addCleanup(daemon.stop)
        stores = []
        for _ in range(2):
            ring = SingleWriterShmRingBuffer(256 * 1024, create=True,
                                             socket_path=daemon.socket_path)
            stores.append(ShmBrokerObjectStorage(64 * 1024, 1, ring))
            self.addCleanup(stores[-1].close)
        a, b = stores
        self.assertEqual(a.put("a1", "A1"), (0, 0))
        self.assertEqual(b.put("b1", "B1"), (0, 0))
        pair = b.put("b2", "B2")
        a.clear()
        self.assertEqual(self.reader_of(b).get(*pair), "B2")

    # A pair whose object went never names the object put after it: another
    # client deletes the store's newest object and a second writer of the
    # ring puts a new one in its place, where the daemon used to hand out
    # the same chunk id again. The old pair is refused as vLLM refuses a pair
    # whose id is not the one stored (ValueError), not read as the new object.
    def test_stale_pair_of_a_deleted_newest_object(self):
        d = self.shared()
        name = "shmb-test-%s" % uuid.uuid4().hex[:12]
        with mock.patch.dict(os.environ, {"SHMBROKER_SOCKET": d.socket_path}):
            w1 = self.make_store(name=name)
            w2 = self.make_store(name=name)
            reader = self.reader_of(w1)
            w1.put("a", "A")
            pair_x = w1.put("x", "X")
            self.assertEqual(reader.get(*pair_x), "X")
            with shmbroker.Client(d.socket_path) as other:
                other.delete("x")
            pair_y = w2.put("y", "Y")
            self.assertNotEqual(pair_y, pair_x)
            with self.assertRaises(ValueError) as cm:
                reader.get(*pair_x)
            self.assertIn("has been modified or is invalid", str(cm.exception))
            self.assertEqual(reader.get(*pair_y), "Y")

    # Pairs out of the data area, or of no object, are refused as vLLM does.
    def test_pairs_of_nothing(self):
        store = self.make_store()
        reader = self.reader_of(store)
        address, monotonic_id = store.put("k", "v")
        for bad in ((-1, 0), (10 ** 12, 0), (address, monotonic_id + 1), (1, 0), (64, 0)):
            with self.assertRaises(ValueError):
                reader.get(*bad)
        self.assertEqual(reader.get(address, monotonic_id), "v")

    # The ring accepts is_free_fn=SingleWriterShmObjectStorage.default_is_free_check
    # (as some vLLM versions pass it), and the store's check says whether an
    # object of its id may go: not while reads are awaited.
    def test_default_is_free_check(self):
        ring = SingleWriterShmRingBuffer(data_buffer_size=100 * 1024, create=True,
                                         is_free_fn=ShmBrokerObjectStorage.default_is_free_check)
        store = ShmBrokerObjectStorage(max_object_size=10 * 1024, n_readers=1, ring_buffer=ring,
                                       reader_lock=threading.Lock())
        self.addCleanup(store.close)
        self.assertIs(ring.is_free_fn, ShmBrokerObjectStorage.default_is_free_check)
        # (an older object whose key k prefixes, read: list("k") names it first)
        store.get(*store.put("kz", "read"))
        address, monotonic_id = store.put("k", "v")
        self.assertFalse(store.default_is_free_check(monotonic_id, memoryview(b"")))
        store.get(address, monotonic_id)
        self.assertTrue(store.default_is_free_check(monotonic_id, memoryview(b"")))
        self.assertTrue(store.default_is_free_check(monotonic_id + 1000, None))


class ProcessesTest(VllmTestCase):
    """Writers and readers in several processes."""

    # One writer, two reader processes (spawned, the handle pickled to them):
    # each reads every object, and then nothing awaits a read any more.
    def test_writer_with_two_reader_processes(self):
        store = self.make_store(buffer_size=1 * MiB, max_object_size=64 * 1024, n_readers=2)
        data = [("user_data", {"name": "Alice", "age": 30, "scores": [95, 87, 92]}),
                ("simple_string", "Hello, World!"), ("number", 42),
                ("list_data", [1, 2, 3, "four", 5.0]), ("bytes", bytes(range(256)) * 100)]
        items = [(k, v) + store.put(k, v) for k, v in data]
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=vllm_helpers.reader_process,
                             args=(store.handle(), items, results)) for _ in range(2)]
        for p in procs:
            p.start()
        got = [results.get(timeout=60) for _ in range(2 * len(items))]
        for p in procs:
            p.join(60)
            self.assertEqual(p.exitcode, 0)
        self.assertEqual(sorted(got), sorted((k, "ok") for k, _ in data for _ in range(2)))
        for k, _ in data:
            self.assert_awaited(store, k, 0)

    # Two writers share one ring name (the second finds the first's private
    # daemon): both store, a reader reads both, and a key is one object for
    # all writers.
    def test_many_writers(self):
        name = "shmb-test-%s" % uuid.uuid4().hex[:12]
        w1 = self.make_store(name=name)
        w2 = self.make_store(name=name)
        self.assertIsNotNone(w1.ring_buffer.daemon)
        self.assertIsNone(w2.ring_buffer.daemon)
        self.assertEqual(w2.ring_buffer.socket_path, named_socket_path(name))
        reader = self.reader_of(w2)
        a1 = w1.put("from_w1", "one")
        a2 = w2.put("from_w2", "two")
        self.assertEqual(reader.get(*a1), "one")
        self.assertEqual(reader.get(*a2), "two")
        with self.assertRaises(ValueError) as cm:
            w2.put("from_w1", "again")
        self.assertEqual(str(cm.exception), "Key 'from_w1' already exists in the storage.")

    # A reader killed (SIGKILL) while it deserializes an object leaves no pin
    # behind: it reads in place, unpinned, the chunk's seal checked after.
    # The object keeps the read it awaits until a reader counts it, as
    # vLLM's in-use flag does: the writer's put that needs its room fails
    # naming it while the reader reads, and after the reader died; a reader
    # that reads it lets it go.
    def test_killed_reader_leaves_no_pin(self):
        store = self.make_store(buffer_size=64 * 1024, max_object_size=40 * 1024, n_readers=1,
                                serde_class=vllm_helpers.StallingSerde)
        client = store.ring_buffer.client
        address, monotonic_id = store.put("first", b"a" * 36000)
        rfd, wfd = os.pipe()
        self.addCleanup(os.close, rfd)
        env = dict(os.environ, STALL_FD=str(wfd),
                   PYTHONPATH=os.pathsep.join([HERE, PACKAGE_DIR, os.environ.get("PYTHONPATH", "")]))
        code = ("import sys, vllm_helpers; vllm_helpers.stalled_reader_main("
                "bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))")
        child = subprocess.Popen([sys.executable, "-c", code, pickle.dumps(store.handle()).hex(),
                                  str(address), str(monotonic_id)], env=env, pass_fds=(wfd,))
        os.close(wfd)
        self.addCleanup(child.wait)
        self.addCleanup(child.kill)
        self.assertEqual(os.read(rfd, 1), b"!")  # it is inside deserialize
        obj = client.list(prefix="first")[0]
        self.assertEqual((obj["pins"], obj["readers"]), (0, 1))
        with self.assertRaises(MemoryError) as cm:
            store.put("second", b"b" * 36000)
        self.assertIn("'first' blocks reclaim (pins=0, awaited reads=1", str(cm.exception))
        child.kill()
        child.wait()
        self.assertEqual(client.stats()["pinned"], 0)
        self.assertEqual(client.list(prefix="first")[0]["readers"], 1)
        handle = store.handle()
        handle.serde_class = vllm.PickleSerde  # the same bytes, a serde that returns
        reader = ShmBrokerObjectStorage.create_from_handle(handle)
        self.addCleanup(reader.close)
        self.assertEqual(len(reader.get(address, monotonic_id)), 36000)
        wait_until(lambda: client.list(prefix="first")[0]["readers"] == 0,
                   "the reader's read to be counted")
        store.put("second", b"b" * 36000)
        self.assertFalse(store.is_cached("first"))

    # The handle pickles (the socket path inside) and opens a working reader.
    def test_handle_pickles(self):
        store = self.make_store()
        handle = pickle.loads(pickle.dumps(store.handle()))
        self.assertEqual(handle.ring_buffer_handle[3], store.ring_buffer.socket_path)
        self.assertIs(handle.serde_class, vllm.PickleSerde)
        reader = ShmBrokerObjectStorage.create_from_handle(handle)
        self.addCleanup(reader.close)
        self.assertFalse(reader.is_writer)
        self.assertFalse(reader.ring_buffer.client.read_only)  # counts in the seals
        self.assertEqual(reader.get(*store.put("k", ("v", 1))), ("v", 1))


def wait_until(predicate, what, timeout=10.0):
    """Poll predicate until true; fail naming what was awaited otherwise."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("Timed out waiting for %s." % what)
        time.sleep(0.01)


class RingModesTest(VllmTestCase):
    """Where a ring finds its daemon."""

    # With no daemon answering, a writer starts a private one of the ring's
    # size (its max object as large as the data area allows) and stops it on
    # close: socket gone, process ended.
    def test_private_daemon_started_and_stopped(self):
        ring = SingleWriterShmRingBuffer(100 * 1024 + 1, create=True)
        daemon = ring.daemon
        self.assertIsNotNone(daemon)
        info = ring.client.info
        self.assertEqual(info["data_size"], 104 * 1024)
        self.assertEqual(info["max_object_size"], 104 * 1024 - 320)
        ring.close()
        self.assertIsNotNone(daemon.returncode)
        self.assertFalse(os.path.exists(daemon.socket_path))

    # A writer whose ring is dropped without close() stops its daemon all the same.
    def test_private_daemon_stopped_when_collected(self):
        ring = SingleWriterShmRingBuffer(64 * 1024, create=True)
        daemon = ring.daemon
        del ring
        gc.collect()
        self.assertIsNotNone(daemon.returncode)

    # With a daemon at $SHMBROKER_SOCKET, writers and readers use it and
    # start nothing; closing them leaves it running (without the writer's
    # objects: test_vllm_leftovers).
    def test_shared_daemon(self):
        with shmbroker.spawn_daemon(1 * MiB) as d:
            with mock.patch.dict(os.environ, {"SHMBROKER_SOCKET": d.socket_path}):
                store = self.make_store()
                self.assertIsNone(store.ring_buffer.daemon)
                self.assertEqual(store.ring_buffer.socket_path, d.socket_path)
                # (an unnamed ring's readers attach through its handle, as
                # each unnamed store on the daemon is a ring of its own)
                reader = ShmBrokerObjectStorage(10 * 1024, 2, SingleWriterShmRingBuffer(
                    *store.ring_buffer.handle()))
                self.addCleanup(reader.close)
                self.assertEqual(reader.get(*store.put("k", "v")), "v")
                store.close()
                self.assertTrue(d.running())
                self.assertEqual(reader.ring_buffer.client.stats()["clients"], 1)

    # A reader opens the ring by name (as vLLM's workers do) and finds the
    # private daemon its writer started.
    def test_reader_by_name(self):
        name = "shmb-test-%s" % uuid.uuid4().hex[:12]
        store = self.make_store(name=name)
        reader_ring = SingleWriterShmRingBuffer(100 * 1024, name=name, create=False)
        reader = ShmBrokerObjectStorage(10 * 1024, 2, reader_ring, reader_lock=None)
        self.addCleanup(reader.close)
        self.assertEqual(reader_ring.socket_path, store.ring_buffer.socket_path)
        self.assertEqual(reader.get(*store.put("k", 7)), 7)

    # A reader with no daemon anywhere is told so, naming where it looked.
    def test_reader_without_daemon(self):
        with self.assertRaises(ConnectionError) as cm:
            SingleWriterShmRingBuffer(1024, name=None, create=False)
        self.assertIn(os.environ["SHMBROKER_SOCKET"], str(cm.exception))


class SurvivalTest(VllmTestCase):
    """What a store lives through: a stale pair after clear(), a daemon
    restart, fork(), vLLM's size arithmetic."""

    # A reader's get of a pair whose object was deleted (clear) and whose key
    # was stored again must not take a read the new object awaits.
    def test_stale_pair_takes_no_read_of_a_newer_object(self):
        store = self.make_store(n_readers=1)
        reader = self.reader_of(store)
        store.put("A", "first, so that K's pair is not (0, 0)")
        old = store.put("K", "old")
        with shmbroker.Client(store.ring_buffer.socket_path) as c:
            c.put("other", b"after K, so that K's freed chunk stays as it is")
        store.clear()
        new = store.put("K", "new")
        self.assertNotEqual(old[0], new[0])
        with self.assertRaises(ValueError):
            reader.get(*old)
        reader.touch("K", *old)
        with shmbroker.Client(store.ring_buffer.socket_path) as c:
            self.assertEqual([(o["key"], o["readers"]) for o in c.list()
                              if o["key"] == "K"], [("K", 1)])
        self.assertEqual(reader.get(*new), "new")

    # The daemon is killed and started again (it adopts the segment): the
    # writer's and the reader's next calls reconnect and go on, and objects
    # committed before read back.
    def test_daemon_restart_under_a_store(self):
        sock = os.path.join(self.tmp, "restart.sock")
        name = "shmb-vllm-restart-%s" % uuid.uuid4().hex[:8]
        d = shmbroker.spawn_daemon(MiB, socket_path=sock, name=name)
        try:
            store = ShmBrokerObjectStorage(10 * 1024, 1, SingleWriterShmRingBuffer(
                MiB, create=True, socket_path=sock))
            self.addCleanup(store.close)
            reader = self.reader_of(store)
            before = store.put("before", "kept")
            # Its commit, sent without waiting, handled before the crash (a
            # commit still on its way when the daemon dies is lost with it).
            store.ring_buffer.client.sync()
            d._proc.kill()  # as a crash: the segment stays, for the next start to adopt
            d._proc.wait()
            d = shmbroker.spawn_daemon(MiB, socket_path=sock, name=name)
            self.assertEqual(reader.get(*before), "kept")
            self.assertEqual(reader.get(*store.put("after", "new")), "new")
            self.assertTrue(store.is_cached("before"))
        finally:
            d.stop()

    # A store inherited across fork() works in the child (a connection of
    # its own there) and the parent's goes on.
    def test_store_across_fork(self):
        store = self.make_store(n_readers=2)
        reader = self.reader_of(store)
        pair = store.put("f", "forked")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                ok = reader.get(*pair) == "forked" and store.put("child", 1) is not None
                os.write(w, b"1" if ok else b"0")
            except BaseException:
                os.write(w, b"0")
            finally:
                os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        self.assertEqual(got, b"1")
        self.assertEqual(reader.get(*pair), "forked")
        with shmbroker.Client(store.ring_buffer.socket_path) as c:
            self.assertTrue(c.contains("child"))  # the child's key_index is its own

    # vLLM counts its 4-byte in-use flag in the size it checks and reports.
    def test_size_counts_the_flag_bytes(self):
        store = self.make_store(max_object_size=1000, serde_class=vllm_helpers.RawSerde)
        store.put("fits", b"x" * 996)
        with self.assertRaises(ValueError) as cm:
            store.put("over", b"x" * 997)
        self.assertEqual(str(cm.exception), "Serialized object size (1001 bytes) exceeds max "
                         "object size (1000 bytes)")


@unittest.skipIf(np is None, "numpy is not installed (Debian: python3-numpy)")
class NumpyTest(VllmTestCase):
    """Arrays through the default serde: out of band, copied on get."""

    # Arrays of several dtypes and orders come back equal and writable, as
    # from an ordinary unpickle, and owning their memory.
    def test_arrays_round_trip(self):
        store = self.make_store(buffer_size=4 * MiB, max_object_size=2 * MiB)
        reader = self.reader_of(store)
        value = {"f": np.arange(10000, dtype=np.float32).reshape(100, 100),
                 "i": np.arange(7, dtype=np.int64), "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
                 "strided": np.arange(100)[::3]}
        got = reader.get(*store.put("arrays", value))
        for k, v in value.items():
            np.testing.assert_array_equal(got[k], v)
            self.assertTrue(got[k].flags.writeable, k)
        got["f"][0, 0] = -1
        self.assertEqual(reader.get(*store.get_cached("arrays"))["f"][0, 0], 0)


class TorchTest(VllmTestCase):
    """Tensors through the default serde."""

    # A tensor comes back equal.
    def test_tensor_round_trip(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed (Debian: python3-torch)")
        store = self.make_store(buffer_size=1 * MiB, max_object_size=512 * 1024)
        reader = self.reader_of(store)
        t = torch.arange(1000, dtype=torch.float32).reshape(10, 100)
        self.assertTrue(torch.equal(reader.get(*store.put("t", t)), t))


if __name__ == "__main__":
    unittest.main()
