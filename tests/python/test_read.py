# SPDX-License-Identifier: Apache-2.0
"""Client.read and read_into: the catalog hash's known answers, the reader of
shmbroker/_catalog.py over segments built by hand (hits, proven misses,
deleted and changed chunks, hostile entries, a change under the copy), and
against a real daemon: hits with no fallback, misses, deleted and evicted
objects, awaited reads counted by read() on read-write and read-only
clients, and a catalog scribbled over by a read-write mapping."""

import json
import mmap
import os
import random
import socket
import struct
import unittest

import support
import shmbroker
from shmbroker import _catalog as C
from shmbroker import _protocol as P

# shmb_catalog_hash(seed, key): the values of the contract's C function
# (FNV-1a 64, seed xor'ed into the offset basis, final mix), computed by a C
# build of it; the C library's tests carry the same table.
HASH_VECTORS = (
    (0x00000000, b"a", 0x2EF7D1316EB86F71),
    (0x00000001, b"a", 0x9FDCEFED1AEBDDE4),
    (0x00000000, b"key", 0xE99A19086F8142A7),
    (0x12345678, b"hello", 0x611807BA437AB1AD),
    (0x00000007, "ключ".encode("utf-8"), 0xB1728E116D8F59A5),
    (0xFFFFFFFF, b"x" * 255, 0x1441C1FDF35D1517),
    # The C library's table (tests/unit/test_catalog_read.c), the same values.
    (0x00000000, b"", 0xFDBDF6AC4FC52E7F),
    (0x00000000, b"hello", 0x5C04F5D5DC8EB1E2),
    (0xDEADBEEF, b"key-0001", 0xEF24B8E6BC1C7045),
    (0x00000001, bytes(range(1, 256)), 0xD861666D7A5E9D24),
)

MOVES = P.CATALOG_MOVES_AT
UNLISTED = P.CATALOG_UNLISTED_AT


class FakeSegment:
    """A segment laid out by hand in a bytearray: header page, data area,
    a catalog of `slots` entries at the end; chunks and entries written
    here as the daemon would."""

    def __init__(self, size=64 * 1024, slots=64, seed=0x5EED):
        self.size = size
        self.buf = bytearray(size)
        self.mv = memoryview(self.buf)
        self.slots = slots
        self.seed = seed
        self.coff = size - 4096
        self.doff = P.HEADER_PAGE
        self.dsize = self.coff - self.doff
        self.next_chunk = self.doff
        self.info = {"size": size, "data_offset": self.doff, "data_size": self.dsize,
                     "catalog_offset": self.coff, "catalog_slots": slots,
                     "catalog_seed": seed, "layout": 2}
        # The header page describes that table, as the daemon's does.
        struct.pack_into("=QQI", self.buf, P.CATALOG_OFFSET_AT, self.coff, slots, seed)
        self.gen = 0

    def catalog(self):
        return C.Catalog.make(self.mv, self.info)

    def chunk(self, key, payload, gen=None, state=P.CHUNK_COMMITTED):
        """Lay a chunk out at the next free place; returns (offset, gen)."""
        raw = key.encode("utf-8")
        if gen is None:
            self.gen += 1
            gen = self.gen
        at = self.next_chunk
        hsize = P.align64(P.CHUNK_HEADER_SIZE + len(raw))
        csize = hsize + P.align64(len(payload))
        P.CHUNK_HEADER.pack_into(self.buf, at, P.CHUNK_MAGIC, state, len(raw), hsize, 0, 1,
                                 csize, len(payload), gen)
        self.buf[at + P.CHUNK_HEADER_SIZE:at + P.CHUNK_HEADER_SIZE + len(raw)] = raw
        self.buf[at + hsize:at + hsize + len(payload)] = payload
        self.next_chunk = at + csize
        return at, gen

    def entry(self, slot, hash32, chunk, gen, size, flags=0, seq=2):
        P.CATALOG_ENTRY.pack_into(self.buf, self.coff + (slot % self.slots) * 32, seq, hash32,
                                  chunk, gen, flags, size)

    def home(self, key):
        h = C.catalog_hash(self.seed, key.encode("utf-8"))
        return h & (self.slots - 1), h >> 32

    def put(self, key, payload, flags=0, probe=0):
        """A chunk and its entry in the first empty entry from its home
        (+ probe)."""
        at, gen = self.chunk(key, payload)
        home, tag = self.home(key)
        slot = home + probe
        while P.CATALOG_ENTRY.unpack_from(self.buf, self.coff + slot % self.slots * 32)[2]:
            slot += 1
        self.entry(slot, tag, at, gen, len(payload), flags)
        return at, gen

    def set32(self, at, v):
        struct.pack_into("=I", self.buf, at, v)

    def set_seal(self, chunk, seal):
        struct.pack_into("=Q", self.buf, chunk + P.SEAL_AT, seal)


def read(cat, key, out=None):
    """Catalog.read of key: (what, value, retries)."""
    what, value, _gen, _flags, _chunk, retries = cat.read(cat.lookup(key, key.encode()), out)
    return what, value, retries


class TestHash(unittest.TestCase):
    def test_known_answers(self):
        """The Python hash gives exactly the C function's values."""
        for seed, key, want in HASH_VECTORS:
            self.assertEqual(C.catalog_hash(seed, key), want, (hex(seed), key[:8]))

    def test_lookup_caches_home_and_tag(self):
        """lookup() keeps the key's home slot and tag from that hash."""
        seg = FakeSegment(slots=64, seed=0x12345678)
        cat = seg.catalog()
        raw, home, tag, hsize = cat.lookup("hello", b"hello")
        self.assertEqual((raw, home, tag, hsize), (b"hello", 0x611807BA437AB1AD & 63,
                                                   0x611807BA, 64))
        self.assertIs(cat.lookup("hello", b"hello"), cat.lookup("hello", b"hello"))


class TestReaderOverHandMadeSegment(unittest.TestCase):
    def test_hit_is_exact(self):
        seg = FakeSegment()
        seg.put("k1", b"one")
        seg.put("k2", bytes(range(200)))
        cat = seg.catalog()
        self.assertEqual(read(cat, "k1"), (C.HIT, b"one", 0))
        self.assertEqual(read(cat, "k2"), (C.HIT, bytes(range(200)), 0))
        out = bytearray(300)
        self.assertEqual(read(cat, "k2", memoryview(out))[:2], (C.HIT, 200))
        self.assertEqual(bytes(out[:200]), bytes(range(200)))

    def test_buffer_too_small_copies_nothing(self):
        seg = FakeSegment()
        seg.put("k", b"abcdef")
        out = bytearray(b"zzzz")
        self.assertEqual(read(seg.catalog(), "k", memoryview(out))[:2], (C.NOBUFS, 6))
        self.assertEqual(out, b"zzzz")

    def test_probe_past_other_keys(self):
        """A key listed slots past its home, behind other keys' entries."""
        seg = FakeSegment()
        home, _ = seg.home("far")
        for i in range(5):
            at, gen = seg.chunk("other%d" % i, b"x")
            seg.entry(home + i, 0xDEAD0000 + i, at, gen, 1)
        seg.put("far", b"found", probe=5)
        self.assertEqual(read(seg.catalog(), "far")[:2], (C.HIT, b"found"))

    def test_full_probe_proves_nothing(self):
        """A probe that runs SHMB_CATALOG_PROBES entries (or, in a smaller
        table, every slot once) without an empty one proves no miss, as
        proto/catalog.c: the daemon is asked. A key at the probe's last
        entry is found."""
        seg = FakeSegment(slots=64)
        at, gen = seg.put("k", b"v")
        home, tag = seg.home("k")
        for p in range(P.CATALOG_PROBES):
            seg.entry(home + p, tag ^ 1, at, gen, 1)
        cat = seg.catalog()
        self.assertEqual(read(cat, "k")[0], C.AGAIN)
        seg.entry(home + P.CATALOG_PROBES - 1, tag, at, gen, 1)
        self.assertEqual(read(cat, "k")[:2], (C.HIT, b"v"))
        small = FakeSegment(slots=16)
        at, gen = small.chunk("k", b"v")
        for slot in range(16):
            small.entry(slot, 0, at, gen, 1)
        self.assertEqual(read(small.catalog(), "k")[0], C.AGAIN)
        home, tag = small.home("k")
        small.entry(home + 15, tag, at, gen, 1)
        self.assertEqual(read(small.catalog(), "k")[:2], (C.HIT, b"v"))

    def test_miss_is_proven_only_when_the_table_is_still(self):
        """An empty entry ends the probe: a miss, unless entries moved (odd
        or changed catalog_moves) or some object is not listed."""
        seg = FakeSegment()
        seg.put("k", b"v")
        cat = seg.catalog()
        self.assertEqual(read(cat, "absent")[0], C.MISS)
        seg.set32(UNLISTED, 1)
        self.assertEqual(read(cat, "absent")[0], C.AGAIN)
        seg.set32(UNLISTED, 0)
        seg.set32(MOVES, 3)
        self.assertEqual(read(cat, "absent")[0], C.AGAIN)
        self.assertEqual(read(cat, "k")[0], C.AGAIN)
        seg.set32(MOVES, 4)
        self.assertEqual(read(cat, "absent")[0], C.MISS)
        # A daemon restarted on the segment laid out another table (another
        # seed): a miss in the one hello gave proves nothing.
        seg.set32(P.CATALOG_SEED_AT, seg.seed + 1)
        self.assertEqual(read(cat, "absent")[0], C.AGAIN)
        self.assertEqual(read(cat, "k")[:2], (C.HIT, b"v"))
        seg.set32(P.CATALOG_SEED_AT, seg.seed)
        self.assertEqual(read(cat, "absent")[0], C.MISS)

    def test_absent_proves_a_miss_from_an_empty_home(self):
        """absent() (a put's look for another writer's object of a new key)
        is True only where read() proves a miss from the key's home entry:
        an empty home entry, catalog_moves even and unchanged, nothing
        unlisted, hello's table. Anything else is False: read() says."""
        seg = FakeSegment(slots=64)
        for i in range(20):
            seg.put("k%d" % i, b"v")
        cat = seg.catalog()
        homes = {seg.home("k%d" % i)[0] for i in range(20)}
        empty = next("n%d" % i for i in range(1000) if seg.home("n%d" % i)[0] not in homes
                     and P.CATALOG_ENTRY.unpack_from(
                         seg.buf, seg.coff + seg.home("n%d" % i)[0] * 32)[2] == 0)
        taken = next("n%d" % i for i in range(1000) if seg.home("n%d" % i)[0] in homes)
        self.assertTrue(cat.absent(empty.encode()))
        self.assertFalse(cat.absent(taken.encode()))  # another key's entry at its home
        self.assertEqual(read(cat, taken)[0], C.MISS)  # which read() probes past
        for i in range(20):
            self.assertFalse(cat.absent(("k%d" % i).encode()))
        for i in range(300):
            key = "q%d" % i
            if cat.absent(key.encode()):
                self.assertEqual(read(cat, key)[0], C.MISS, key)
        self.assertFalse(cat.absent(b"x" * (P.KEY_MAX + 1)))
        # Nothing proven while entries move, an object is unlisted, the
        # table is another's, or the home entry is being written.
        for at, bad, good in ((MOVES, 3, 4), (UNLISTED, 1, 0),
                              (P.CATALOG_SEED_AT, seg.seed + 1, seg.seed)):
            seg.set32(at, bad)
            self.assertFalse(cat.absent(empty.encode()), at)
            seg.set32(at, good)
            self.assertTrue(cat.absent(empty.encode()), at)
        home = seg.home(empty)[0]
        seg.entry(home, 0, 0, 0, 0, seq=3)
        self.assertFalse(cat.absent(empty.encode()))
        seg.entry(home, 0, 0, 0, 0, seq=4)
        self.assertTrue(cat.absent(empty.encode()))

    def test_deleted_or_reused_chunk_is_not_read(self):
        """Seal 0 (deleted), another generation (reused), another state,
        another key in the chunk, another magic or payload size: the entry
        is passed over, and as it has the key's tag the miss after it is not
        proven (the daemon is asked), as proto/catalog.c does."""
        seg = FakeSegment()
        at, gen = seg.put("k", b"payload")
        cat = seg.catalog()
        seg.set_seal(at, 0)
        self.assertEqual(read(cat, "k")[0], C.AGAIN)
        seg.set_seal(at, gen + 1)
        self.assertEqual(read(cat, "k")[0], C.AGAIN)
        seg.set_seal(at, (5 << 32) | gen)  # a count beside the generation is fine
        self.assertEqual(read(cat, "k")[:2], (C.HIT, b"payload"))
        struct.pack_into("=H", seg.buf, at + 4, P.CHUNK_FREE)
        self.assertEqual(read(cat, "k")[0], C.AGAIN)
        struct.pack_into("=H", seg.buf, at + 4, P.CHUNK_COMMITTED)
        seg.buf[at + P.CHUNK_HEADER_SIZE] = ord("j")
        self.assertEqual(read(cat, "k")[0], C.AGAIN)
        seg.buf[at + P.CHUNK_HEADER_SIZE] = ord("k")
        self.assertEqual(read(cat, "k")[:2], (C.HIT, b"payload"))
        seg.set32(at, P.CHUNK_MAGIC ^ 1)
        self.assertEqual(read(cat, "k")[0], C.AGAIN)
        seg.set32(at, P.CHUNK_MAGIC)
        struct.pack_into("=Q", seg.buf, at + 32, 8)  # payload_size: not the entry's 7
        self.assertEqual(read(cat, "k")[0], C.AGAIN)
        struct.pack_into("=Q", seg.buf, at + 32, 7)
        self.assertEqual(read(cat, "k")[:2], (C.HIT, b"payload"))

    def test_entry_being_written_asks_the_daemon(self):
        seg = FakeSegment()
        at, gen = seg.put("k", b"v")
        home, tag = seg.home("k")
        seg.entry(home, tag, at, gen, 1, seq=7)
        self.assertEqual(read(seg.catalog(), "k")[0], C.AGAIN)

    def test_no_catalog_or_inconsistent_figures(self):
        """Hello's figures must describe a catalog inside the mapping."""
        seg = FakeSegment()
        good = dict(seg.info)
        self.assertIsNotNone(C.Catalog.make(seg.mv, good))
        for change in ({"catalog_slots": 0}, {"catalog_slots": 48},
                       {"catalog_offset": seg.coff + 8},
                       {"catalog_offset": seg.size}, {"catalog_slots": 256},
                       {"catalog_offset": seg.doff}, {"catalog_seed": -1},
                       {"catalog_seed": None}, {"layout": 1}):
            info = dict(good, **change)
            self.assertIsNone(C.Catalog.make(seg.mv, info), change)

    def test_hostile_entries_never_give_another_keys_bytes(self):
        """Entries with the key's tag pointing at another key's chunk (its
        generation, its size), outside the data area, unaligned, over the
        catalog, of size 0 or huge: none is read; random entries neither
        (an empty one ends the probe: a miss, the worst a scribble can do).
        A miss past entries of the key's tag that failed their checks is not
        proven: the daemon is asked."""
        seg = FakeSegment()
        other, ogen = seg.put("other", b"OTHER BYTES")
        home, tag = seg.home("mine")
        bad = [(other, ogen, 11), (64, ogen, 11), (other + 8, ogen, 11), (seg.coff, 1, 64),
               (other, ogen, 0), (other, ogen, 1 << 62), (seg.size - 64, 1, 64),
               (1 << 63, 1, 1), (other, 0, 11)]
        for i, (chunk, gen, size) in enumerate(bad):
            seg.entry(home + i, tag, chunk, gen, size)
        cat = seg.catalog()
        self.assertEqual(read(cat, "mine")[0], C.AGAIN)
        seg.put("mine", b"MINE", probe=len(bad))
        self.assertEqual(read(cat, "mine")[:2], (C.HIT, b"MINE"))
        rng = random.Random(16)
        for _ in range(300):
            slot = rng.randrange(seg.slots)
            chunk = rng.choice([other, rng.randrange(1 << 64), rng.randrange(seg.size)])
            seg.entry(slot, rng.choice([tag, rng.randrange(1 << 32)]), chunk,
                      rng.choice([ogen, rng.randrange(1 << 32)]), rng.randrange(1 << 16),
                      seq=rng.randrange(1 << 32))
            what, value, _ = read(cat, "mine")
            self.assertIn(what, (C.HIT, C.MISS, C.AGAIN))
            if what == C.HIT:
                self.assertEqual(value, b"MINE")

    def test_change_under_the_copy_is_seen(self):
        """A generation changed while the payload is copied: the copy is
        redone; when it keeps changing, the read asks the daemon."""
        seg = FakeSegment()
        at, gen = seg.put("k", b"payload!")

        class Changing:
            """A buffer whose writes bump the chunk's generation first."""

            def __init__(self, times):
                self.times = times
                self.data = bytearray(16)

            def __len__(self):
                return len(self.data)

            def __setitem__(self, where, value):
                if self.times:
                    self.times -= 1
                    seg.set_seal(at, gen + 100)  # reused under the copy...
                self.data[where] = value

        cat = seg.catalog()

        def restore_then(out):
            what, value, retries = read(cat, "k", out)
            seg.set_seal(at, gen)
            return what, value, retries

        out = Changing(10)
        # Changed under every copy (the seal stays changed): passed over,
        # and the retried read, past an entry of the key that fails its
        # checks now, asks the daemon.
        what, _, retries = restore_then(out)
        self.assertEqual((what, retries), (C.AGAIN, 1))
        self.assertEqual(read(cat, "k")[:2], (C.HIT, b"payload!"))


class CountingFence:
    """An acquire fence that counts its calls, and may act as a writer
    whose stores become visible at the nth call (act(n))."""

    def __init__(self, inner=None, act=None):
        self.inner, self.act, self.calls = inner, act, 0

    def __call__(self):
        self.calls += 1
        if self.inner is not None:
            self.inner()
        if self.act is not None:
            self.act(self.calls)


def libatomic_fence():
    """The fence a machine without TSO gets (GCC's libatomic), loaded on
    this one; None when libatomic is not installed."""
    fence, why = C.load_fence("aarch64")
    return fence


class TestOrderedReads(unittest.TestCase):
    """The reader on a machine without x86-64's ordering: acquire fences
    from libatomic after each first load of a sequence word or seal and
    before each second look, the same results as without them."""

    def setUp(self):
        self.fence = libatomic_fence()
        if self.fence is None:
            self.skipTest("no libatomic.so.1 here (Debian: libatomic1)")

    def test_which_machines_need_what(self):
        """x86-64 needs no fence; another 64-bit machine gets libatomic's,
        and without it no catalog, with a message that says what to
        install; the fence really is callable."""
        self.assertEqual(C.load_fence("x86_64"), (None, None))
        self.assertEqual(C.load_fence("AMD64"), (None, None))
        fence, why = C.load_fence("aarch64")
        self.assertIsNone(why)
        fence()
        fence, why = C.load_fence("aarch64", library="libatomic-not-here.so.9")
        self.assertIsNone(fence)
        self.assertIn("libatomic1", why)
        self.assertIn("aarch64", why)

    def test_no_fence_no_catalog(self):
        """Catalog.make gives no catalog where no correct read is possible,
        so that every read asks the daemon."""
        seg = FakeSegment()
        saved = (C._fence, C.why_no_catalog, C._loaded)
        self.addCleanup(lambda: setattr(C, "_fence", saved[0]) or setattr(
            C, "why_no_catalog", saved[1]) or setattr(C, "_loaded", saved[2]))
        C._fence, C.why_no_catalog, C._loaded = None, "no fence here", True
        self.assertIsNone(C.Catalog.make(seg.mv, seg.info))
        C._fence, C.why_no_catalog = self.fence, None
        self.assertIs(C.Catalog.make(seg.mv, seg.info).fence, self.fence)

    def ordered(self, seg, act=None):
        fence = CountingFence(self.fence, act)
        return C.Catalog.make(seg.mv, seg.info, fence=fence), fence

    def test_same_results_with_fences(self):
        """Hits, misses, hostile entries and a table in motion: the reader
        with fences gives what the one without gives, and fences every
        sequence word and seal: a hit costs six fences (moves, the entry's
        seq before and after its fields, the seal, after the copy and the
        seal after it)."""
        seg = FakeSegment()
        seg.put("k1", b"one")
        at, gen = seg.put("k2", bytes(range(200)))
        cat, fence = self.ordered(seg)
        plain = C.Catalog.make(seg.mv, seg.info, fence=None)  # no fences, on any machine
        self.assertIsNone(plain.fence)
        self.assertEqual(read(cat, "k1"), (C.HIT, b"one", 0))
        self.assertEqual(fence.calls, 6)
        for key in ("k1", "k2", "absent"):
            self.assertEqual(read(cat, key), read(plain, key))
        seg.set_seal(at, gen + 1)
        self.assertEqual(read(cat, "k2")[0], C.AGAIN)
        seg.set32(MOVES, 3)
        self.assertEqual(read(cat, "absent")[0], C.AGAIN)
        seg.set32(MOVES, 4)
        self.assertEqual(read(cat, "absent")[0], C.MISS)

    def test_acquire_loads_are_fenced(self):
        """Each load that proto/catalog.c makes with acquire order (the
        moves word, the entry's seq, the seal before and after the copy,
        the unlisted word) is followed by a fence before any other load of
        the mapping, so that the loads after it (the key and state after
        the copy's seal, say) cannot be served before it."""
        seg = FakeSegment()
        at, _gen = seg.put("k", b"value")
        home, _ = seg.home("k")
        log = []

        class Logged:
            def __init__(self, words, names):
                self.words, self.names = words, names

            def __getitem__(self, i):
                log.append(self.names.get(i, "other"))
                return self.words[i]

        cat, fence = self.ordered(seg, lambda n: log.append("fence"))
        seq_at = (seg.coff + home * 32) >> 2
        cat.w32 = Logged(cat.w32, {MOVES >> 2: "moves", P.CATALOG_UNLISTED_AT >> 2: "unlisted",
                                   seq_at: "seq"})
        cat.w64 = Logged(cat.w64, {(at + P.SEAL_AT) >> 3: "seal"})
        for key, want in (("k", C.HIT), ("absent", C.MISS)):
            del log[:]
            self.assertEqual(read(cat, key)[0], want)
            acquired = [n for n, what in enumerate(log) if what in ("seal", "unlisted")]
            acquired += [log.index(first) for first in ("moves", "seq") if first in log]
            self.assertTrue(acquired)
            for n in acquired:
                self.assertEqual(log[n + 1:n + 2], ["fence"], "%s: %s at %d of %s"
                                 % (key, log[n], n, log))
        del log[:]
        self.assertEqual(read(cat, "k")[0], C.HIT)
        self.assertEqual(log.count("seal"), 2)  # before the copy and after it

    def test_entry_written_between_the_fences(self):
        """The daemon rewrites the entry after the reader's first look at
        its seq (visible at the fence that follows it): the reader sees the
        seq changed at its second look and looks again."""
        seg = FakeSegment()
        seg.put("k", b"value")
        home, _ = seg.home("k")
        seq_at = seg.coff + home * 32

        def writer(n):
            if n == 2:  # moves' fence, then the entry's first one
                seg.set32(seq_at, struct.unpack_from("=I", seg.buf, seq_at)[0] + 2)

        cat, fence = self.ordered(seg, writer)
        self.assertEqual(read(cat, "k"), (C.HIT, b"value", 0))
        self.assertEqual(fence.calls, 8)  # the entry read twice

    def test_chunk_reused_during_the_copy(self):
        """The chunk's generation changes while the payload is copied
        (visible at the fence after the copy): the copy is not returned."""
        seg = FakeSegment()
        at, gen = seg.put("k", b"value")

        def writer(n):
            if n == 5:
                seg.set_seal(at, gen + 1)

        cat, fence = self.ordered(seg, writer)
        what, value, retries = read(cat, "k")
        self.assertEqual((what, retries), (C.AGAIN, 1))


class FakeDaemon(support.FakeServer):
    """A server that passes a FakeSegment (written to a file) with hello,
    its catalog's figures in the reply, then records every request and
    answers get (from gets, key -> (offset, size)) and contains."""

    def __init__(self, test, seg, mode="rw", gets=None):
        super().__init__(test, "shmb-fake-read-")
        self.seg_path = os.path.join(self.dir, "seg")
        # magic, version, header_size, total_size, data_offset, data_size
        struct.pack_into("=QIIQQQ", seg.buf, 0, P.SEGMENT_MAGIC, P.LAYOUT_VERSION, 4096,
                         seg.size, seg.doff, seg.dsize)
        with open(self.seg_path, "wb") as f:
            f.write(seg.buf)
        self.info = dict(seg.info, ok=True, version=1, segment="fake", max_object_size=4096,
                         alignment=64, mode=mode)
        self.gets = gets or {}
        self.start()

    def serve(self):
        conn, _ = self.listener.accept()
        with conn:
            f = conn.makefile("rb")
            for line in f:
                req = json.loads(line)
                self.seen.append(req)
                if req["op"] == "hello":
                    fd = os.open(self.seg_path, os.O_RDWR)
                    socket.send_fds(conn, [(json.dumps(dict(self.info, id=req["id"]))
                                            + "\n").encode()], [fd])
                    os.close(fd)
                elif req["op"] == "get" and req["key"] in self.gets:
                    off, size = self.gets[req["key"]]
                    conn.sendall(b'{"ok":true,"offset":%d,"size":%d,"id":%d}\n'
                                 % (off, size, req["id"]))
                elif req["op"] == "get":
                    conn.sendall(b'{"ok":false,"error":"ENOENT","message":"No object.",'
                                 b'"id":%d}\n' % req["id"])
                elif req["op"] == "contains":
                    conn.sendall(b'{"ok":true,"exists":false,"id":%d}\n' % req["id"])

    def ops(self):
        """The requests after hello, as (op, key, gen, noreply)."""
        return [(r["op"], r.get("key"), r.get("gen"), r.get("noreply")) for r in self.seen[1:]]

    def seal(self, chunk):
        with open(self.seg_path, "rb") as f:
            f.seek(chunk + P.SEAL_AT)
            return struct.unpack("=Q", f.read(8))[0]


class TestClientOverFakeDaemon(unittest.TestCase):
    """Client.read's use of the catalog, against a fake daemon whose
    segment is built by hand: what is asked of the daemon, and when."""

    def connect(self, seg, **kw):
        mode = "ro" if kw.get("read_only") else "rw"
        fake = FakeDaemon(self, seg, mode, kw.pop("gets", None))
        c = shmbroker.Client(fake.path, **kw)
        self.addCleanup(c.close)
        c._sock.settimeout(5)
        return fake, c

    def sync(self, fake, c):
        """A round trip, so that every request sent before is recorded."""
        self.assertFalse(c.contains("sync"))

    def test_hits_and_misses_ask_nothing(self):
        seg = FakeSegment()
        seg.put("k", b"value")
        fake, c = self.connect(seg)
        self.assertEqual(c.read("k"), b"value")
        buf = bytearray(8)
        self.assertEqual(c.read_into("k", buf), 5)
        self.assertEqual(bytes(buf[:5]), b"value")
        with self.assertRaises(shmbroker.NotFound):
            c.read("absent")
        with self.assertRaises(shmbroker.BufferTooSmall) as e:
            c.read_into("k", bytearray(4))
        self.assertEqual(e.exception.size, 5)
        self.sync(fake, c)
        self.assertEqual(fake.ops(), [("contains", "sync", None, None)])
        self.assertEqual(c.read_stats(), {"fast": 4, "fallback": 0, "retries": 0})

    def test_fallback_when_the_catalog_cannot_say(self):
        """Unlisted objects: a miss proves nothing, the daemon is asked (get,
        then a noreply release)."""
        seg = FakeSegment()
        at, _ = seg.chunk("unlisted", b"from the daemon")
        seg.set32(UNLISTED, 1)
        hsize = P.align64(P.CHUNK_HEADER_SIZE + len("unlisted"))
        fake, c = self.connect(seg, gets={"unlisted": (at + hsize, 15)})
        self.assertEqual(c.read("unlisted"), b"from the daemon")
        with self.assertRaises(shmbroker.NotFound):
            c.read("absent")
        self.sync(fake, c)
        self.assertEqual(fake.ops(), [("get", "unlisted", None, None),
                                      ("release", "unlisted", None, True),
                                      ("get", "absent", None, None),
                                      ("contains", "sync", None, None)])
        self.assertEqual(c.read_stats(), {"fast": 0, "fallback": 2, "retries": 0})

    def test_awaited_read_counted_in_the_seal(self):
        """A read-write client adds 1 to the seal's count per read of an
        awaited object, keeping its generation; nothing is sent. Objects
        not awaited are not counted."""
        seg = FakeSegment()
        at, gen = seg.put("aw", b"awaited", flags=P.CATALOG_AWAITED)
        plain, pgen = seg.put("plain", b"not awaited")
        fake, c = self.connect(seg)
        for _ in range(3):
            self.assertEqual(c.read("aw"), b"awaited")
        self.assertEqual(c.read("plain"), b"not awaited")
        self.sync(fake, c)
        self.assertEqual(fake.ops(), [("contains", "sync", None, None)])
        self.assertEqual(fake.seal(at), (3 << 32) | gen)
        self.assertEqual(fake.seal(plain), pgen)

    def test_awaited_read_reported_by_read_only(self):
        """A read-only client reports each awaited read as a noreply read of
        that key and generation, and leaves the seal alone."""
        seg = FakeSegment()
        at, gen = seg.put("aw", b"awaited", flags=P.CATALOG_AWAITED)
        fake, c = self.connect(seg, read_only=True)
        self.assertEqual(c.read("aw"), b"awaited")
        self.assertEqual(c.read("aw"), b"awaited")
        self.sync(fake, c)
        self.assertEqual(fake.ops(), [("read", "aw", gen, True), ("read", "aw", gen, True),
                                      ("contains", "sync", None, None)])
        self.assertEqual(fake.seal(at), gen)


class TestReadFromDaemon(support.DaemonTest):
    """read() against a daemon that publishes its catalog."""

    def setUp(self):
        super().setUp()
        self.assertGreater(self.c.info.get("catalog_slots", 0), 0,
                           "shmbrokerd's hello publishes no catalog: %r" % (self.c.info,))

    def readers_of(self, key):
        """The awaited reads the daemon counts for key (list folds in what
        reads in place added)."""
        (entry,) = [o for o in self.c.list(key) if o["key"] == key]
        return entry["readers"]

    def test_hits_are_exact_with_no_fallback(self):
        sizes = (1, 63, 64, 65, 4096, 4097, 100000)
        for n in sizes:
            self.c.put("obj%d" % n, os.urandom(n))
        for n in sizes:
            pin = self.c.get("obj%d" % n)
            want = bytes(pin.view)
            pin.release()
            self.assertEqual(self.c.read("obj%d" % n), want)
            buf = bytearray(n + 3)
            self.assertEqual(self.c.read_into("obj%d" % n, buf), n)
            self.assertEqual(bytes(buf[:n]), want)
        self.assertEqual(self.c.read_stats(), {"fast": 2 * len(sizes), "fallback": 0,
                                               "retries": 0})
        with self.assertRaises(shmbroker.BufferTooSmall) as e:
            self.c.read_into("obj4097", bytearray(4096))
        self.assertEqual(e.exception.size, 4097)

    def test_miss_deleted_and_evicted(self):
        """A key never put, one deleted, one evicted: NotFound from the
        mapping (no fallback); the objects still there read exactly."""
        with self.assertRaises(shmbroker.NotFound):
            self.c.read("never")
        self.c.put("gone", b"soon deleted")
        self.assertEqual(self.c.read("gone"), b"soon deleted")
        self.c.delete("gone")
        with self.assertRaises(shmbroker.NotFound):
            self.c.read("gone")
        big = self.c.info["data_size"] // 5
        for i in range(12):
            self.c.put("big%d" % i, bytes([i]) * big)
        self.assertGreater(self.stats()["counters"]["evictions"], 0)
        for i in range(12):
            try:
                self.assertEqual(self.c.read("big%d" % i), bytes([i]) * big)
                present = True
            except shmbroker.NotFound:
                present = False
            self.assertEqual(present, self.c.contains("big%d" % i), i)
        self.assertEqual(self.c.read_stats()["fallback"], 0)

    def test_one_call_at_a_time(self):
        """read(), read_into() and reconnect() while another thread's call
        runs on the client are refused with EBUSY, as every other call (and
        as shmb_read and shmb_reconnect): they neither read the mapping
        under that call nor replace its connection and mapping."""
        self.c.put("k", b"value")
        pin = self.c.get("k")
        self.addCleanup(pin.release)
        refused = []
        self.c._busy.acquire()  # as another thread's call holds it
        try:
            for call in (lambda: self.c.read("k"), lambda: self.c.read_into("k", bytearray(8)),
                         self.c.reconnect):
                try:
                    call()
                    refused.append("went through")
                except shmbroker.ShmBrokerError as e:
                    refused.append(e.code)
        finally:
            self.c._busy.release()
        self.assertEqual(refused, ["EBUSY", "EBUSY", "EBUSY"])
        self.assertEqual(self.c.read("k"), b"value")
        self.assertEqual(self.c.list("k")[0]["pins"], 1)  # the same connection, its pin kept

    def test_awaited_read_with_a_broken_connection(self):
        """A read-only client reads an awaited object from the mapping while
        its connection breaks under the "read" that reports it: the read
        returns the bytes (it was exact), as shmb_read, and the next call
        says the connection is lost."""
        self.c.put("aw", b"awaited bytes", readers=1)
        ro = self.d.client(read_only=True)
        self.addCleanup(ro.close)
        ro._sock.shutdown(socket.SHUT_WR)  # its next send fails (EPIPE)
        ro._looked = float("inf")  # and read() does not look at it first
        self.assertEqual(ro.read("aw"), b"awaited bytes")
        self.assertEqual(ro.read_stats()["fast"], 1)
        with self.assertRaises(shmbroker.ConnectionLost):
            ro.contains("aw")

    def awaited(self, reader):
        """An object awaiting 2 reads: reader's read()s count them, and then
        it may go (a put that needs its space succeeds)."""
        big = self.c.info["data_size"] * 2 // 5
        self.c.put("awaited", b"a" * big, readers=2)
        self.c.put("filler", b"f" * big)
        self.assertEqual(self.readers_of("awaited"), 2)
        with self.assertRaises(shmbroker.NoSpace):
            self.c.put("next", b"n" * big)
        self.assertEqual(reader.read("awaited"), b"a" * big)
        reader.contains("awaited")  # a round trip: a noreply read was handled before it
        self.assertEqual(self.readers_of("awaited"), 1)
        self.assertEqual(reader.read("awaited"), b"a" * big)
        reader.contains("awaited")
        self.assertEqual(self.readers_of("awaited"), 0)
        self.assertEqual(reader.read_stats()["fallback"], 0)
        self.c.put("next", b"n" * big)
        with self.assertRaises(shmbroker.NotFound):
            reader.read("awaited")
        self.assertGreaterEqual(self.stats()["counters"]["fast_reads"], 2)

    def test_awaited_reads_counted_read_write(self):
        reader = self.d.client(name="rw-reader")
        self.addCleanup(reader.close)
        self.awaited(reader)

    def test_awaited_reads_counted_read_only(self):
        reader = self.d.client(name="ro-reader", read_only=True)
        self.addCleanup(reader.close)
        self.awaited(reader)

    def test_read_at_answers_as_read(self):
        """_read_at (the vLLM store's read of its base) and read() make one
        read from the catalog: a hit gives the bytes, with the chunk and
        generation _read_at names, counted "fast" and its awaited read
        counted by either; a miss raises the same NotFound, counted too;
        without a catalog _read_at says None and read() asks the daemon."""
        reader = self.d.client(name="at-reader")
        self.addCleanup(reader.close)
        off = self.c.put("at", b"base bytes", readers=2)
        chunk = off - P.align64(P.CHUNK_HEADER_SIZE + len("at"))
        value, at, gen = reader._read_at("at")
        self.assertEqual((value, at), (b"base bytes", chunk))
        self.assertEqual(gen, reader._catalog.w64[(chunk + P.SEAL_AT) >> 3] & 0xFFFFFFFF)
        reader.contains("at")  # a round trip: a noreply read was handled before it
        self.assertEqual(self.readers_of("at"), 1)
        self.assertEqual(reader.read("at"), b"base bytes")
        reader.contains("at")
        self.assertEqual(self.readers_of("at"), 0)
        with self.assertRaises(shmbroker.NotFound) as by_read_at:
            reader._read_at("absent")
        with self.assertRaises(shmbroker.NotFound) as by_read:
            reader.read("absent")
        self.assertEqual(str(by_read_at.exception), str(by_read.exception))
        self.assertIn("'absent'", str(by_read.exception))
        self.assertEqual(reader.read_stats(), {"fast": 4, "fallback": 0, "retries": 0})
        reader._catalog = None
        self.assertIsNone(reader._read_at("at"))
        self.assertEqual(reader.read("at"), b"base bytes")
        self.assertEqual(reader.read_stats(), {"fast": 4, "fallback": 1, "retries": 0})

    def test_scribbled_catalog(self):
        """A read-write mapping of the segment scribbles over the catalog and
        the header's catalog words: reads give the key's own bytes or
        NotFound, never another key's, never crash; the daemon goes on."""
        keys = ["key%d" % i for i in range(40)]
        chunks = {}
        for k in keys:
            off = self.c.put(k, k.encode() * 7)
            chunks[k] = off - P.align64(P.CHUNK_HEADER_SIZE + len(k))
        info = self.c.info
        path = os.path.join(self.d.shm_dir, self.d.name)
        with open(path, "r+b") as f:
            m = mmap.mmap(f.fileno(), info["size"])
        self.addCleanup(m.close)
        coff, slots, seed = info["catalog_offset"], info["catalog_slots"], info["catalog_seed"]
        rng = random.Random(1616)

        def check_all():
            for k in keys:
                try:
                    got = self.c.read(k)
                except shmbroker.NotFound:
                    continue
                self.assertEqual(got, k.encode() * 7, k)

        for round_ in range(30):
            victim, other = rng.sample(keys, 2)
            h = C.catalog_hash(seed, victim.encode())
            home, tag = h & (slots - 1), h >> 32
            ochunk = chunks[other]
            ogen = struct.unpack_from("=Q", m, ochunk + P.SEAL_AT)[0] & 0xFFFFFFFF
            for p in range(4):
                # The victim's tag, pointing at the other key's chunk.
                P.CATALOG_ENTRY.pack_into(m, coff + ((home + p) % slots) * 32, 2 * round_, tag,
                                          ochunk, ogen, 0, len(other) * 7)
            at = coff + rng.randrange(slots) * 32
            m[at:at + 32] = os.urandom(32)
            if round_ % 7 == 3:
                struct.pack_into("=I", m, MOVES, rng.randrange(1 << 32))
            check_all()
        m[coff:coff + slots * 32] = os.urandom(slots * 32)
        check_all()
        self.assertEqual(self.c.stats()["objects"], len(keys))


if __name__ == "__main__":
    unittest.main()
