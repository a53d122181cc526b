# SPDX-License-Identifier: Apache-2.0
"""Conformance of the object store drop-ins with vLLM: the behaviours vLLM's
tests/distributed/test_shm_buffer.py and test_shm_storage.py check, written
anew, run on shmbroker.vllm through vLLM's own import path (the stand-in
module vllm_standin/vllm/distributed/device_communicators/shm_object_storage.py),
with the classes made as vLLM's tests and vllm/multimodal/cache/shm.py make
them: a ring of a given size (create=True starts a private daemon here, as
no daemon answers at $SHMBROKER_SOCKET), a multiprocessing Lock as
reader_lock, vLLM's default serde. Mirrored: vLLM commit
cfbb13b5b3b590b9a8104f1f3d480f0e21fa1fa3 (the store; its multimodal cache,
vllm/multimodal/cache/shm.py, at 01ebf92b00573d7acc7b834969b6a4f3dcc21d30),
df020506de5a6aa4cbb736aedba57dde50cd44ee (test_shm_storage.py),
4c980f2d54add57fe0694330f16b91c9d64a2974 (test_shm_buffer.py). The
shm-cache case of tests/multimodal's cache tests is test_vllm.EvictionOrderTest;
readers in other processes, test_vllm.ProcessesTest.
"""

import multiprocessing
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
for path in (os.path.join(HERE, "vllm_standin"), PACKAGE_DIR):
    if path not in sys.path:
        sys.path.insert(0, path)

import shmbroker.vllm  # noqa: E402
from vllm.distributed.device_communicators.shm_object_storage import (  # noqa: E402
    MsgpackSerde, SingleWriterShmObjectStorage, SingleWriterShmRingBuffer)

# Another stand-in's "vllm" imported first (in the same run) would make these
# tests test its classes: say so rather than pass on them.
if (SingleWriterShmRingBuffer is not shmbroker.vllm.SingleWriterShmRingBuffer
        or SingleWriterShmObjectStorage is not shmbroker.vllm.SingleWriterShmObjectStorage):
    raise ImportError("vllm.distributed.device_communicators.shm_object_storage is not the "
                      "stand-in of tests/python/vllm_standin (another vllm package was imported "
                      "first: %s); these tests would not test shmbroker's classes."
                      % sys.modules["vllm"].__path__)


class StandinTestCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="shmb-conf-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        env = mock.patch.dict(os.environ, {"SHMBROKER_SOCKET": os.path.join(self.tmp, "none.sock")})
        env.start()
        self.addCleanup(env.stop)


class RingConformanceTest(StandinTestCase):
    """test_shm_buffer.py's behaviours, on a ring made as vLLM makes it."""

    def ring(self, size):
        ring = SingleWriterShmRingBuffer(data_buffer_size=size, create=True)
        self.addCleanup(ring.close)
        return ring

    # A ring opened from handle() is a reader naming the same memory.
    def test_buffer_opening(self):
        ring = self.ring(4096)
        reader = SingleWriterShmRingBuffer(*ring.handle())
        self.addCleanup(reader.close)
        self.assertFalse(reader.is_writer)
        self.assertEqual(reader.shared_memory.name, ring.shared_memory.name)

    # Bytes written through access_buf read back with their id.
    def test_buffer_access(self):
        ring = self.ring(4096)
        address, monotonic_id = ring.allocate_buf(100)
        data = b"0123456789abc" * 7
        with ring.access_buf(address) as (buf, _md):
            buf[0:len(data)] = data
        with ring.access_buf(address) as (buf, md):
            self.assertEqual((bytes(buf[0:len(data)]), md[0]), (data, monotonic_id))

    # 100 and 80 bytes (196 with ids and sizes) fill 200; one more byte does not fit.
    def test_memory_error_on_full_buffer(self):
        ring = self.ring(200)
        ring.allocate_buf(100)
        ring.allocate_buf(80)
        with self.assertRaises(MemoryError):
            ring.allocate_buf(1)

    # Allocate 80, free all, five times: each free returns that round's id first.
    def test_allocation_and_free(self):
        ring = self.ring(200)
        for i in range(5):
            address, _monotonic_id = ring.allocate_buf(80)
            with ring.access_buf(address) as (buf, _md):
                buf[0:4] = (0).to_bytes(4, "little")
                buf[4:12] = b"payload!"
            self.assertEqual(ring.free_buf(lambda *args: True)[0], i)

    # clear() leaves no metadata and every counter at 0.
    def test_clear_buffer(self):
        ring = self.ring(4096)
        for _ in range(3):
            ring.allocate_buf(100)
        ring.clear()
        self.assertEqual(len(ring.metadata), 0)
        self.assertEqual((ring.monotonic_id_start, ring.monotonic_id_end,
                          ring.data_buffer_start, ring.data_buffer_end), (0, 0, 0, 0))


class StorageConformanceTest(StandinTestCase):
    """test_shm_storage.py's behaviours: a 100 KiB ring, a 10 KiB max
    object, two readers, a lock, vLLM's serde; the writer reads through the
    store, and with its lock its reads count as the readers' would."""

    ring_kwargs = {}

    def setUp(self):
        super().setUp()
        ring = SingleWriterShmRingBuffer(data_buffer_size=1024 * 100, create=True,
                                         **self.ring_kwargs)
        self.storage = SingleWriterShmObjectStorage(max_object_size=1024 * 10, n_readers=2,
                                                    ring_buffer=ring, serde_class=MsgpackSerde,
                                                    reader_lock=multiprocessing.Lock())
        self.addCleanup(self.storage.close)

    def fill(self, stored, stop=1000):
        """put item_i ... until MemoryError, as vLLM's tests fill the buffer."""
        try:
            for i in range(len(stored), stop):
                key, value = "item_%d" % i, ("data_%d" % i) * 100
                stored.append((key, value) + self.storage.put(key, value))
        except MemoryError:
            pass
        return stored

    def read_all(self, items):
        """Each item read n_readers times; how many read back equal."""
        ok = 0
        for _key, value, address, monotonic_id in items:
            for _ in range(self.storage.n_readers):
                got = self.storage.get(address, monotonic_id)
            ok += got == value
        return ok

    # put indexes the key both ways; get returns the value.
    def test_minimal_put_get_cycle(self):
        value = {"field1": list(range(10)), "field2": bytes(20)}
        address, monotonic_id = self.storage.put("test_key", value)
        self.assertEqual(self.storage.key_index["test_key"], (address, monotonic_id))
        self.assertEqual(self.storage.id_index[monotonic_id], "test_key")
        self.assertEqual(self.storage.get(address, monotonic_id), value)

    # Values of many Python types round-trip.
    def test_various_data_types(self):
        cases = [("s", "hello world"), ("i", 42), ("f", 3.14159), ("l", [1, 2, 3, "four", 5.0]),
                 ("d", {"name": "Alice", "age": 30}), ("t", (1, "two", 3.0, [4, 5])),
                 ("n", {"users": [{"id": 1, "m": {"active": True}}], "c": {"v": "1.0"}}),
                 ("none", None), ("b", True), ("bytes", b"binary data")]
        pairs = [(k, v) + self.storage.put(k, v) for k, v in cases]
        for key, value, address, monotonic_id in pairs:
            self.assertEqual(self.storage.get(address, monotonic_id), value, key)

    # A key put twice: the second put raises ValueError "already exists".
    def test_put_same_key_twice(self):
        pair = self.storage.put("duplicate_key", "first value")
        self.assertEqual(self.storage.get(*pair), "first value")
        with self.assertRaises(ValueError) as cm:
            self.storage.put("duplicate_key", "second value")
        self.assertIn("already exists in the storage", str(cm.exception))

    # An object over max_object_size: ValueError "exceeds max object size".
    def test_large_object_rejection(self):
        with self.assertRaises(ValueError) as cm:
            self.storage.put("large_key", "x" * (self.storage.max_object_size + 100))
        self.assertIn("exceeds max object size", str(cm.exception))

    # Fill, read everything n_readers times, and the buffer takes as many
    # items again; every item stored after reads back.
    def test_buffer_overflow_and_cleanup(self):
        stored = self.fill([])
        first = len(stored)
        self.assertGreater(first, 10)
        self.assertEqual(self.read_all(stored), first)
        self.fill(stored)
        self.assertGreater(len(stored), first + 10)
        self.assertEqual(self.read_all(stored[first:]), len(stored) - first)

    # The oldest object unread blocks the next put even though all the
    # others were read; read, it lets at least ten more in.
    def test_blocking_unread_object(self):
        stored = self.fill([])
        self.assertEqual(self.read_all(stored[1:]), len(stored) - 1)
        with self.assertRaises(MemoryError):
            self.storage.put("item_%d" % len(stored), "more" * 100)
        self.assertEqual(self.read_all(stored[:1]), 1)
        before = len(stored)
        self.fill(stored)
        self.assertGreaterEqual(len(stored), before + 10)

    # A pair of nothing, or of a wrong id: ValueError "has been modified or is invalid".
    def test_invalid_get_operations(self):
        with self.assertRaises(ValueError):
            self.storage.get(99999, 1)
        address, monotonic_id = self.storage.put("test", "value")
        with self.assertRaises(ValueError) as cm:
            self.storage.get(address, monotonic_id + 100)
        self.assertIn("has been modified or is invalid", str(cm.exception))

    # clear() empties the indexes and the ring's metadata; the next put is (0, 0).
    def test_clear_storage(self):
        for i in range(5):
            self.storage.put("item_%d" % i, "value_%d" % i)
        self.storage.clear()
        self.assertEqual(len(self.storage.key_index), 0)
        self.assertEqual(len(self.storage.id_index), 0)
        self.assertEqual(len(self.storage.ring_buffer.metadata), 0)
        self.assertEqual(self.storage.put("new_item", "new_value"), (0, 0))
        self.assertIn("new_item", self.storage.key_index)


class StorageWithIsFreeFnTest(StorageConformanceTest):
    """The same, with the ring made as some vLLM versions make it:
    is_free_fn=SingleWriterShmObjectStorage.default_is_free_check."""

    @property
    def ring_kwargs(self):
        return {"is_free_fn": SingleWriterShmObjectStorage.default_is_free_check}


if __name__ == "__main__":
    unittest.main()
