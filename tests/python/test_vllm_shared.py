# SPDX-License-Identifier: Apache-2.0
"""The shared multimodal cache (shmbroker.vllm_shared): several API-server
writers and the engine's workers share one store on one daemon; and the
hook that lets vLLM use it with several API servers, against a small
stand-in of vLLM's decision and sender cache.
"""

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import shmbroker  # noqa: E402
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer  # noqa: E402
from shmbroker.vllm_shared import (SharedShmObjectStorage, daemon_key,  # noqa: E402
                                   enable_shared_mm_cache)

import vllm_shared_helpers as H  # noqa: E402

KiB = 1024


class SharedTestCase(unittest.TestCase):
    """A daemon of its own; stores of one ring name on it."""

    DAEMON_SIZE = 1024 * KiB
    store_class = SharedShmObjectStorage

    def setUp(self):
        self.daemon = shmbroker.spawn_daemon(self.DAEMON_SIZE)
        self.addCleanup(self.daemon.stop)
        self.name = "mm-" + uuid.uuid4().hex[:12]
        self.client = shmbroker.Client(self.daemon.socket_path)
        self.addCleanup(self.client.close)

    def store(self, writer=True, n_readers=2, cls=None):
        ring = SingleWriterShmRingBuffer(data_buffer_size=self.DAEMON_SIZE, name=self.name,
                                         create=writer, socket_path=self.daemon.socket_path)
        s = (cls or self.store_class)(max_object_size=64 * KiB, n_readers=n_readers,
                                      ring_buffer=ring)
        self.addCleanup(s.close)
        return s

    def awaited(self, key):
        key = daemon_key(self.name, key)
        for obj in self.client.list(key):
            if obj["key"] == key:
                return obj["readers"]
        return None

    def assert_awaited(self, key, want):
        """The object of key comes to await want reads: a reader's get
        counts its read by a request it does not wait for, which the daemon
        handles a moment later."""
        deadline = time.monotonic() + 10
        while self.awaited(key) != want and time.monotonic() < deadline:
            time.sleep(0.002)
        self.assertEqual(self.awaited(key), want)

    def objects_of(self, key):
        key = daemon_key(self.name, key)
        return [o for o in self.client.list(key) if o["key"] == key]


class SharedStoreTest(SharedTestCase):

    # is_cached and get_cached of one writer see another writer's object; the
    # pair handed out is the one the other writer's put gave, and readers
    # read it. (The single-writer store sees only its own objects.)
    def test_writers_see_each_others_objects(self):
        a, b = self.store(), self.store()
        reader = self.store(writer=False)
        pair = a.put("k", b"A" * 3000)
        self.assertTrue(b.is_cached("k"))
        self.assertEqual(b.get_cached("k"), pair)
        self.assertEqual(b.key_index["k"], pair)
        self.assertEqual(reader.get(*pair), b"A" * 3000)
        self.assertFalse(b.is_cached("absent"))
        with self.assertRaises(KeyError):
            b.get_cached("absent")

    # vLLM's sender touches each item of a request, then asks is_cached and,
    # when True, get_cached at once, relying on nothing going in between.
    # An item this writer's touch missed, which another writer put since and
    # whose reads are all done, is kept from eviction by is_cached itself
    # (the touch it missed, made then): another client's puts filling the
    # daemon meanwhile do not make get_cached raise KeyError.
    def test_found_after_a_missed_touch_is_kept(self):
        a, b = self.store(), self.store()
        readers = [self.store(writer=False), self.store(writer=False)]
        first = a.put("first", b"f" * 1000)
        for r in readers:
            r.get(*first)
        a.touch("x")  # not stored yet: missed
        pair = b.put("x", b"X" * 3000)
        for r in readers:
            self.assertEqual(r.get(*pair), b"X" * 3000)
        self.assert_awaited("x", 0)
        self.assertTrue(a.is_cached("x"))
        filler = shmbroker.Client(self.daemon.socket_path)
        self.addCleanup(filler.close)
        for i in range(2 * self.DAEMON_SIZE // (32 * KiB)):
            try:
                filler.put("fill-%d" % i, b"z" * (32 * KiB))
            except shmbroker.NoSpace:
                break
        self.assertEqual(a.get_cached("x"), pair)
        for r in readers:
            self.assertEqual(r.get(*pair), b"X" * 3000)

    # Another tenant of the daemon (a client of its own, or the shared store
    # of another ring, as another deployment's) with an object of the same
    # key is not this ring's: is_cached does not see it, put stores this
    # ring's own object, and readers read this ring's bytes. (Handing the
    # other tenant's object out gave readers its bytes for this key.)
    def test_other_tenants_keys_are_not_handed_out(self):
        self.client.put("k", b"another tenant's bytes")
        other = SingleWriterShmRingBuffer(data_buffer_size=self.DAEMON_SIZE, name="other-ring",
                                          create=True, socket_path=self.daemon.socket_path)
        theirs = SharedShmObjectStorage(max_object_size=64 * KiB, n_readers=2,
                                        ring_buffer=other)
        self.addCleanup(theirs.close)
        theirs.put("j", b"another ring's bytes")
        a = self.store()
        reader = self.store(writer=False)
        a.put("first", b"this ring's first item")  # the ring has its base
        for key in ("k", "j"):
            self.assertFalse(a.is_cached(key))
            pair = a.put(key, b"this ring's bytes of " + key.encode())
            self.assertEqual(reader.get(*pair), b"this ring's bytes of " + key.encode())
        self.assertEqual(a.shared_stats["handed_out_others"], 0)
        self.assertEqual(self.client.read("k"), b"another tenant's bytes")

    # A put costs the same however many objects the writer holds: it finds
    # an object whose chunk id the daemon reused by that id, instead of
    # walking every object (20000 small puts took minutes, each slower than
    # the last).
    def test_put_does_not_walk_every_object(self):
        a = self.store()
        for i in range(300):
            a.put("item-%d" % i, b"v")

        class Walked(dict):
            count = 0

            def items(self):
                for kv in super().items():
                    Walked.count += 1
                    yield kv

        a._objects = Walked(a._objects)
        a.put("one more", b"v")
        self.assertEqual(len(a._objects), 301)
        self.assertLess(Walked.count, 30)

    # The same key put by two writers is stored once: the second put returns
    # the first's pair, and the daemon holds one object of that key; a writer
    # putting its own key again gets vLLM's ValueError.
    def test_same_key_put_twice_stored_once(self):
        a, b = self.store(), self.store()
        commits = self.client.stats()["counters"]["commits"]
        pair = a.put("k", b"x" * 5000)
        self.assertEqual(b.put("k", b"x" * 5000), pair)
        self.assertEqual(len(self.objects_of("k")), 1)
        # Two commits: the object and the ring's base, not a second object.
        self.assertEqual(self.client.stats()["counters"]["commits"] - commits, 2)
        self.assertEqual(b.shared_stats["put_found"], 1)
        self.assertEqual(a.shared_stats["stored"], 1)
        with self.assertRaisesRegex(ValueError, "Key 'k' already exists in the storage."):
            a.put("k", b"x")

    # Each hand-out awaits the reads vLLM's readers make of it (the first
    # sight of a pair is one read, each later one two, touch and get),
    # whichever writer handed it out, also when the writer's touch came
    # before another writer stored the key: the object stays until the last
    # reader's last read, and no read is left awaited after it.
    def test_hand_outs_await_every_read(self):
        a, b = self.store(), self.store()
        r1, r2 = self.store(writer=False), self.store(writer=False)
        b.touch("k")  # b's request: nothing there yet
        pair = a.put("k", b"v" * 2000)
        self.assert_awaited("k", 2)
        self.assertTrue(b.is_cached("k"))
        self.assertEqual(b.get_cached("k"), pair)
        self.assert_awaited("k", 6)
        a.touch("k")
        self.assertEqual(a.get_cached("k"), pair)
        self.assert_awaited("k", 10)
        for n, r in enumerate((r1, r2)):
            for _ in range(3):  # a's put, b's hand-out, a's hand-out
                r.touch("k", *pair)
                self.assertEqual(r.get(*pair), b"v" * 2000)
            self.assert_awaited("k", 5 if n == 0 else 0)

    # A touch that found nothing counts only for its own request: when the
    # next request's touch finds the object, its hand-out adds no more.
    def test_a_missed_touch_counts_once(self):
        a, b = self.store(), self.store()
        b.touch("k")  # request 1 of b: nothing there, and its put failed
        pair = a.put("k", b"v")
        b.touch("k")  # request 2 of b: found
        self.assertEqual(b.get_cached("k"), pair)
        self.assert_awaited("k", 2 + 4)

    # Others' objects that the daemon evicted leave this writer's key_index
    # as it hands out newer ones, so that a long run's index stays the size
    # of what is stored.
    def test_evicted_hand_outs_leave_the_index(self):
        a, b = self.store(n_readers=0), self.store(n_readers=0)
        keys = ["k%d" % i for i in range(100)]
        for k in keys:
            a.put(k, bytes(40 * KiB))  # 4 MB through a 1 MiB daemon
            b.get_cached(k)
        stored = [k for k in keys if self.objects_of(k)]
        self.assertLess(len(stored), 30)
        # A few evicted since their last check may be left.
        self.assertLessEqual(len(b.key_index), len(stored) + 8)
        self.assertEqual(sorted(b.id_index.values()), sorted(b.key_index))

    # A put that finds the key stored by another writer hands it out as a
    # touch and get_cached would: two reads for each reader.
    def test_put_found_counts_as_a_hand_out(self):
        a, b = self.store(), self.store()
        r1 = self.store(writer=False)
        pair = a.put("k", b"v")
        r1.touch("k", *pair)
        r1.get(*pair)
        b.touch("k")  # found: two awaited reads
        self.assertEqual(b.put("k", b"v"), pair)
        self.assert_awaited("k", 1 + 2 + 4)

    # clear() deletes only this writer's objects that no reader awaits, keeps
    # counting pairs from the shared base, and the other writers' pairs stay
    # good.
    def test_clear_keeps_awaited_objects(self):
        a, b = self.store(n_readers=1), self.store(n_readers=1)
        reader = self.store(writer=False)
        p1 = a.put("k1", b"1" * 100)
        p2 = a.put("k2", b"2" * 100)
        reader.get(*p1)
        a.clear()
        self.assertEqual(self.objects_of("k1"), [])
        self.assertEqual(len(self.objects_of("k2")), 1)
        self.assertEqual(a.key_index, {})
        self.assertEqual(b.get_cached("k2"), p2)
        self.assertEqual(reader.get(*p2), b"2" * 100)
        self.assertNotEqual(a.put("k3", b"3"), (0, 0))


# A shared writer on the daemon at argv[2], ring argv[3]: puts "read" and
# "awaited" (one reader each), prints its guard's pid and the pairs, then
# waits to be killed.
KILLED_WRITER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import shmbroker.vllm
import shmbroker._vllm_guard
from shmbroker.vllm import SingleWriterShmRingBuffer
from shmbroker.vllm_shared import SharedShmObjectStorage
if len(sys.argv) > 4:
    shmbroker._vllm_guard._GUARD_GRACE_S = float(sys.argv[4])
ring = SingleWriterShmRingBuffer(1 << 20, name=sys.argv[3], create=True, socket_path=sys.argv[2])
store = SharedShmObjectStorage(1 << 16, 1, ring)
pairs = {k: store.put(k, k.encode() * 100) for k in ("read", "awaited")}
print(json.dumps({"guard": store._guard[2].pid, "pairs": pairs}), flush=True)
sys.stdin.read()
"""


class KilledWriterTest(SharedTestCase):

    def killed_writer(self, *grace):
        """A shared writer in a child that put "read" and "awaited" (one reader
        each), read "read" here, and was killed with SIGKILL: the pairs and
        its guard's pid, and the reader."""
        child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, PACKAGE_DIR,
                                  self.daemon.socket_path, self.name] + list(grace),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.addCleanup(child.wait)
        self.addCleanup(child.kill)
        self.addCleanup(child.stdin.close)
        self.addCleanup(child.stdout.close)
        info = json.loads(child.stdout.readline())
        reader = self.store(writer=False)
        self.assertEqual(reader.get(*info["pairs"]["read"]), b"read" * 100)
        child.send_signal(signal.SIGKILL)
        child.wait()
        return info, reader

    def until(self, what, done):
        deadline = time.monotonic() + 30
        while not done():
            self.assertLess(time.monotonic(), deadline, what)
            time.sleep(0.01)

    @staticmethod
    def gone(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    # A shared writer killed with SIGKILL: its guard deletes the objects no
    # reader awaits, and leaves the one a reader has still to read (another
    # API server may have handed it out), which the reader then reads; once
    # read, the guard deletes it too and goes.
    def test_guard_keeps_awaited_objects(self):
        info, reader = self.killed_writer()
        self.until("the guard did not delete the object read",
                   lambda: self.objects_of("read") == [])
        self.assertEqual(len(self.objects_of("awaited")), 1)
        self.assertEqual(reader.get(*info["pairs"]["awaited"]), b"awaited" * 100)
        self.until("the guard did not finish", lambda: self.gone(info["guard"]))
        self.assertEqual(self.objects_of("awaited"), [])

    # A shared writer that closes leaves the objects readers await to its
    # guard, as a killed one does: each deleted once read, those no reader
    # reads deleted after the guard's grace; close() had left them for ever.
    def test_close_leaves_awaited_objects_to_the_guard(self):
        grace = shmbroker._vllm_guard._GUARD_GRACE_S
        shmbroker._vllm_guard._GUARD_GRACE_S = 0.2
        self.addCleanup(setattr, shmbroker._vllm_guard, "_GUARD_GRACE_S", grace)
        a = self.store()
        a.put("awaited", b"a" * 1000)
        guard = a._guard[2]
        a.close()
        guard.wait(30)
        self.assertEqual(self.objects_of("awaited"), [])

    # Readers that never come do not hold a killed writer's objects for
    # ever: past the guard's grace, it deletes the objects still awaited
    # (which otherwise blocked every client's reclaim) and goes.
    def test_guard_deletes_what_no_reader_reads_in_its_grace(self):
        info, reader = self.killed_writer("0.2")
        self.until("the guard did not finish", lambda: self.gone(info["guard"]))
        self.assertEqual(self.objects_of("read"), [])
        self.assertEqual(self.objects_of("awaited"), [])


class ManyProcessesTest(SharedTestCase):
    """4 API-server writer processes with overlapping keys and 2 engine-worker
    reader processes, each following vLLM's sender and receiver cache
    protocol, every byte checked."""

    DAEMON_SIZE = 192 * KiB
    NWRITERS = 4
    NREADERS = 2

    def run_processes(self, phases_of, items, shared=True):
        ctx = multiprocessing.get_context("fork")
        cfg = {"socket": self.daemon.socket_path, "name": self.name, "items": items,
               "ring_size": self.DAEMON_SIZE, "max_object_size": 64 * KiB, "shared": shared,
               "close_after": ctx.Event(), "window": 2,
               "acks": [ctx.Queue() for _ in range(self.NWRITERS)]}
        queues = [ctx.Queue() for _ in range(self.NREADERS)]
        results = ctx.Queue()
        barrier = ctx.Barrier(self.NWRITERS, timeout=120)
        procs = [ctx.Process(target=H.reader_main, args=(r, cfg, queues[r], self.NWRITERS,
                                                          results))
                 for r in range(self.NREADERS)]
        procs += [ctx.Process(target=H.writer_main, args=(w, cfg, phases_of(w), queues,
                                                           barrier, results))
                  for w in range(self.NWRITERS)]
        for p in procs:
            p.start()
        writers, readers, errors = {}, {}, []
        try:
            for _ in range(self.NWRITERS + self.NREADERS):
                r = results.get(timeout=180)
                if r[0] == "writer":
                    writers[r[1]] = (r[2], r[3])
                elif r[0] == "reader":
                    readers[r[1]] = (r[2], r[3])
                    if len(readers) == self.NREADERS:
                        # Every read done: what still awaits a read now is a
                        # count the hand-outs got wrong.
                        ours = {daemon_key(self.name, k): k for k in items}
                        self.snapshot = [dict(o, key=ours[o["key"]])
                                         for o in self.client.list(limit=100000)
                                         if o["key"] in ours]
                        self.left_awaited = [o for o in self.snapshot if o["readers"]]
                        cfg["close_after"].set()
                else:
                    errors.append(r)
        finally:
            cfg["close_after"].set()
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
                    p.join()
        self.assertEqual(errors, [])
        return writers, readers

    # Phase 1: every writer sends the same 8 items at once (no eviction):
    # each is stored once, every writer hands out the same pair for it, the
    # daemon holds 8 objects of their bytes, not 32. Phase 2: 40 requests
    # per writer of 3 items drawn from 40 (about 290 KiB) in a daemon of
    # 192 KiB: items are evicted and put again, puts fail for room (the item
    # is sent itself), and every reader reads every item with its bytes, none
    # evicted while awaited, and no read is left awaited at the end.
    def test_four_writers_two_readers(self):
        sizes = [4 * KiB + 512 * (i % 13) for i in range(40)]
        keys = ["mm-%02d" % i for i in range(40)]
        items = {k: H.value_of(k, s) for k, s in zip(keys, sizes)}
        first = keys[:8]

        def phases_of(w):
            return [[first], H.requests_for(w, keys, 40, 3, seed=1)]

        evictions = self.client.stats()["counters"]["evictions"]
        writers, readers = self.run_processes(phases_of, items)
        self.assertEqual(sorted(readers), list(range(self.NREADERS)))
        for rid, (read, bad) in readers.items():
            self.assertEqual(bad, [], "reader %d" % rid)
            self.assertEqual(read, self.NWRITERS * (1 + 40))
        # Phase 1: one pair per key, shared by all writers; stored once.
        pairs = {}
        for wid, (stats, outs) in writers.items():
            for m in outs[0][0]:
                self.assertEqual(m[1], "addr", "writer %d sent %s itself" % (wid, m[0]))
                pairs.setdefault(m[0], set()).add(m[2:])
        self.assertEqual(sorted(pairs), first)
        self.assertTrue(all(len(p) == 1 for p in pairs.values()), pairs)
        stored = sum(s["stored"] for s, _ in writers.values())
        found = sum(s["put_found"] + s["handed_out_others"] for s, _ in writers.values())
        self.assertGreater(found, 0)
        self.assertLess(stored, sum(len(set(k for r in phases_of(w)[1] for k in r))
                                    for w in range(self.NWRITERS)) + len(first) * 4)
        # Under eviction pressure, and no read left awaited.
        self.assertGreater(self.client.stats()["counters"]["evictions"] - evictions, 0)
        self.assertEqual(self.left_awaited, [])

    # 4 writers sending the same 8 items at once: the daemon holds each
    # once (8 objects, the bytes of 8 items), every writer sent addresses
    # only, and the writers stored 8 objects in all.
    def test_stored_once_in_the_daemon(self):
        keys = ["same-%d" % i for i in range(8)]
        items = {k: H.value_of(k, 6 * KiB) for k in keys}
        seen = {}

        def phases_of(w):
            return [[keys]]

        writers, readers = self.run_processes(phases_of, items)
        for rid, (read, bad) in readers.items():
            self.assertEqual(bad, [], "reader %d" % rid)
        for k in keys:
            seen[k] = [o for o in self.snapshot if o["key"] == k]
        self.assertEqual({k: len(v) for k, v in seen.items()}, {k: 1 for k in keys})
        # The bytes of 8 items (each with its pickle framing), not of 32.
        held = sum(v[0]["size"] for v in seen.values())
        self.assertGreaterEqual(held, 8 * 6 * KiB)
        self.assertLess(held, 8 * 7 * KiB)
        self.assertEqual(sum(s["stored"] for s, _ in writers.values()), 8)
        for stats, outs in writers.values():
            self.assertTrue(all(m[1] == "addr" for m in outs[0][0]))


# ---- the hook, against a stand-in of vLLM's decision and sender cache -------

class _Config:
    """The few fields of a VllmConfig the decision reads."""

    def __init__(self, api=2, dp=1, external_lb=False, cache_type="shm", gb=4.0):
        self.parallel_config = types.SimpleNamespace(_api_process_count=api,
                                                     data_parallel_size=dp,
                                                     data_parallel_external_lb=external_lb)
        mm = types.SimpleNamespace(mm_processor_cache_type=cache_type, mm_processor_cache_gb=gb)
        self.model_config = types.SimpleNamespace(get_multimodal_config=lambda: mm,
                                                  supports_multimodal_inputs=True)


def _standin_modules(store_factory):
    """vllm.multimodal.cache.factories and .shm as small modules of our own:
    the decision falls back to a per-process cache with several API servers,
    and the sender cache keeps its prompt updates per process, as vLLM's."""
    factories = types.ModuleType("vllm.multimodal.cache.factories")

    def _get_cache_type(vllm_config):
        mm = vllm_config.model_config.get_multimodal_config()
        if mm.mm_processor_cache_gb <= 0:
            return None
        p = vllm_config.parallel_config
        if not (p._api_process_count == 1 and (p.data_parallel_size == 1
                                               or p.data_parallel_external_lb)):
            return "processor_only"
        return mm.mm_processor_cache_type

    factories._get_cache_type = _get_cache_type
    shm = types.ModuleType("vllm.multimodal.cache.shm")
    shm.SingleWriterShmObjectStorage = ShmBrokerObjectStorage

    class ShmObjectStoreSenderCache:
        def __init__(self):
            self._shm_cache = store_factory(shm.SingleWriterShmObjectStorage)
            self._p0_cache = {}

        def is_cached_item(self, mm_hash):
            return self._shm_cache.is_cached(mm_hash)

        def get_and_update_item(self, mm_item, mm_hash):
            if self._shm_cache.is_cached(mm_hash):
                pair = self._shm_cache.get_cached(mm_hash)
                return pair, self._p0_cache[mm_hash]
            item, updates = mm_item
            try:
                pair = self._shm_cache.put(mm_hash, item)
            except (ValueError, MemoryError):
                return mm_item
            self._p0_cache[mm_hash] = updates
            return pair, updates

    shm.ShmObjectStoreSenderCache = ShmObjectStoreSenderCache
    return {"vllm.multimodal.cache.factories": factories, "vllm.multimodal.cache.shm": shm}


class HookTest(SharedTestCase):

    def modules(self):
        return _standin_modules(lambda cls: cls(max_object_size=64 * KiB, n_readers=1,
                                                ring_buffer=SingleWriterShmRingBuffer(
                                                    self.DAEMON_SIZE, name=self.name,
                                                    create=True,
                                                    socket_path=self.daemon.socket_path)))

    # With several API servers and the shm cache asked for, the decision says
    # "shm" instead of a cache per process; nothing else changes.
    def test_decision(self):
        mods = self.modules()
        decide = lambda c: mods["vllm.multimodal.cache.factories"]._get_cache_type(c)  # noqa
        self.assertEqual(decide(_Config(api=4)), "processor_only")
        changed = enable_shared_mm_cache(mods)
        self.assertIn("vllm.multimodal.cache.factories._get_cache_type", changed)
        self.assertEqual(decide(_Config(api=4)), "shm")
        self.assertEqual(decide(_Config(api=1)), "shm")
        self.assertEqual(decide(_Config(api=4, cache_type="lru")), "processor_only")
        self.assertEqual(decide(_Config(api=4, dp=2)), "processor_only")
        self.assertEqual(decide(_Config(api=4, dp=2, external_lb=True)), "shm")
        self.assertIsNone(decide(_Config(api=4, gb=0)))
        self.assertEqual(enable_shared_mm_cache(mods), [])  # once is enough

    # Two API servers' sender caches share one store: the second finds the
    # first's item, keeps its own prompt updates, and stores nothing more.
    def test_sender_caches_share_one_store(self):
        mods = self.modules()
        enable_shared_mm_cache(mods)
        cls = mods["vllm.multimodal.cache.shm"].ShmObjectStoreSenderCache
        p0a, p0b = cls(), cls()
        for c in (p0a, p0b):
            self.addCleanup(c._shm_cache.close)
        self.assertIsInstance(p0a._shm_cache, SharedShmObjectStorage)
        pair, updates = p0a.get_and_update_item((b"pixels" * 100, ["upd-a"]), "h")
        self.assertTrue(p0a.is_cached_item("h"))
        self.assertFalse(p0b.is_cached_item("h"))  # b has no prompt updates of it
        self.assertEqual(p0b.get_and_update_item((b"pixels" * 100, ["upd-b"]), "h"),
                         (pair, ["upd-b"]))
        self.assertTrue(p0b.is_cached_item("h"))
        self.assertEqual(len(self.objects_of("h")), 1)

    # A vLLM whose modules have neither decision nor sender cache is refused
    # loudly, and nothing is changed.
    def test_unknown_vllm_refused(self):
        mods = self.modules()
        del mods["vllm.multimodal.cache.factories"]
        with self.assertRaisesRegex(RuntimeError, "SHMBROKER_VLLM_SHARED_MM is set"):
            enable_shared_mm_cache(mods)
        self.assertIs(mods["vllm.multimodal.cache.shm"].SingleWriterShmObjectStorage,
                      ShmBrokerObjectStorage)


# ---- the plugin, with and without SHMBROKER_VLLM_SHARED_MM ------------------

# The child: load vLLM's plugins (the stand-in's loader, through the entry
# point), ask the decision about 4 API servers, and pass one item through two
# API servers' sender caches.
SHARED_PROBE = r'''
import json, os, sys, types
from vllm.plugins import load_general_plugins
out = {}
try:
    load_general_plugins()
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
import vllm.multimodal.cache as mm
from shmbroker.vllm import PickleSerde
mmc = types.SimpleNamespace(mm_processor_cache_type="shm", mm_processor_cache_gb=4)
config = types.SimpleNamespace(
    parallel_config=types.SimpleNamespace(_api_process_count=4, data_parallel_size=1,
                                          data_parallel_external_lb=False),
    model_config=types.SimpleNamespace(get_multimodal_config=lambda: mmc))
out["decision"] = mm._get_cache_type(config)
out["store"] = mm.SingleWriterShmObjectStorage.__name__
if "error" not in out:
    name = "shared-probe-%d" % os.getpid()
    a = mm.ShmObjectStoreSenderCache(name, 1 << 20, 1 << 16, 1, PickleSerde)
    b = mm.ShmObjectStoreSenderCache(name, 1 << 20, 1 << 16, 1, PickleSerde)
    pa = a.get_and_update_item((b"img" * 100, ["a"]), "h")
    pb = b.get_and_update_item((b"img" * 100, ["b"]), "h")
    out["same_pair"] = list(pa[0]) == list(pb[0]) if isinstance(pb[0], tuple) else False
    a.close()
    b.close()
print(json.dumps(out))
'''


class PluginSharedTest(unittest.TestCase):
    """The plugin (shmbroker.vllm_plugin) turns the shared mode on in a
    stand-in vLLM when SHMBROKER_VLLM_SHARED_MM=1, and only then."""

    def setUp(self):
        import test_vllm_plugin as TP  # its stand-in vLLM and dist-info maker
        self.TP = TP
        self.tmp = tempfile.mkdtemp(prefix="shmb-shared-plugin-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.site = os.path.join(self.tmp, "site")
        os.makedirs(self.site)
        TP.make_dist_info(self.site)
        self.d = shmbroker.spawn_daemon(8 << 20)
        self.addCleanup(self.d.stop)

    def probe(self, env):
        e = {k: v for k, v in os.environ.items()
             if not k.startswith("SHMBROKER_VLLM") and k not in ("SHMBROKER_SOCKET",
                                                                  "VLLM_PLUGINS")}
        e["PYTHONPATH"] = os.pathsep.join([self.site, self.TP.STANDIN, PACKAGE_DIR])
        e.update(env)
        p = subprocess.run([sys.executable, "-c", SHARED_PROBE], env=e, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120, cwd=self.tmp)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        return json.loads(p.stdout.decode().strip().splitlines()[-1]), p.stderr.decode()

    # SHMBROKER_VLLM_SHARED_MM=1: vLLM chooses the shm cache with 4 API
    # servers, its store is the shared one, and two API servers' senders
    # hand out one object for the same item.
    def test_shared_mode_on(self):
        out, err = self.probe({"SHMBROKER_VLLM": self.d.socket_path,
                               "SHMBROKER_VLLM_SHARED_MM": "1"})
        self.assertNotIn("error", out, err)
        self.assertEqual(out["decision"], "shm")
        self.assertEqual(out["store"], "SharedShmObjectStorage")
        self.assertTrue(out["same_pair"])

    # Without it (or with 0), vLLM keeps its cache per API server and the
    # single-writer drop-in; a value it does not understand is refused.
    def test_shared_mode_off(self):
        for env in ({}, {"SHMBROKER_VLLM_SHARED_MM": "0"}):
            out, err = self.probe(dict(env, SHMBROKER_VLLM=self.d.socket_path))
            self.assertNotIn("error", out, err)
            self.assertEqual(out["decision"], "processor_only")
            self.assertEqual(out["store"], "ShmBrokerObjectStorage")
        out, _ = self.probe({"SHMBROKER_VLLM": self.d.socket_path,
                             "SHMBROKER_VLLM_SHARED_MM": "maybe"})
        self.assertIn("SHMBROKER_VLLM_SHARED_MM='maybe'", out["error"])


if __name__ == "__main__":
    unittest.main()
