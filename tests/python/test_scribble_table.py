# SPDX-License-Identifier: Apache-2.0
"""The scribble table (tests/scribble/cases), row by row, against a real
daemon: each row scribbles over the segment through a read-write mapping,
then Client.read (on a read-write and a read-only client) and the C
library's shmb_read (build/tests/shmb-read-tool, both kinds of handle) read
the same scribbled segment. Every one of the four reads must give the row's
outcome: from the mapping or from the daemon, exactly the victim's bytes or
not found, never another key's bytes; so the two readers cannot drift apart
again. TestScribbleStorm makes such damage while a writer and the Python
readers work, concurrently (tests/e2e/test_scribble.c's storm does it for
shmb_read)."""

import mmap
import multiprocessing
import os
import random
import struct
import subprocess
import threading
import unittest

import support
from shmbroker import _catalog as C
from shmbroker import _protocol as P
import shmbroker

TABLE = os.path.join(support.ROOT, "tests", "scribble", "cases")
SIZE = 100

# Where each name of the table is: (offset, width) in the victim's entry,
# its chunk header, or the segment header.
ENTRY_FIELDS = {"seq": (0, 4), "hash": (4, 4), "chunk": (8, 8), "gen": (16, 4),
                "flags": (20, 4), "size": (24, 8)}
CHUNK_FIELDS = {"magic": (0, 4), "state": (4, 2), "key_len": (6, 2), "header_size": (8, 4),
                "tag": (12, 4), "id": (16, 8), "chunk_size": (24, 8),
                "payload_size": (32, 8), "seal": (40, 8)}
HEADER_FIELDS = {"moves": (P.CATALOG_MOVES_AT, 4), "unlisted": (P.CATALOG_UNLISTED_AT, 4),
                 "seed": (P.CATALOG_SEED_AT, 4), "slots": (P.CATALOG_SLOTS_AT, 8),
                 "offset": (P.CATALOG_OFFSET_AT, 8), "retired": (P.SEGMENT_RETIRED_AT, 4)}
OUTCOMES = ("hit", "daemon", "notfound", "daemon-notfound")


def read_tool():
    """$SHMB_BUILD_DIR/tests/shmb-read-tool, else the source tree's build/."""
    build = os.environ.get("SHMB_BUILD_DIR") or os.path.join(support.ROOT, "build")
    return os.path.join(os.path.abspath(build), "tests", "shmb-read-tool")


def load_table(path=TABLE):
    """The rows: (line number, name, read, where, change, expect)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].split()
            if not line:
                continue
            if len(line) != 5 or line[4] not in OUTCOMES:
                raise ValueError("%s:%d: a row is NAME READ WHERE CHANGE EXPECT, EXPECT one "
                                 "of %s" % (path, n, ", ".join(OUTCOMES)))
            rows.append((n,) + tuple(line))
    return rows


def payload(row, which):
    """The 100 bytes of a row's object: differ per row and per object."""
    return bytes((row * 7 + which * 101 + i * 13) & 0xFF for i in range(SIZE))


def changed(value, change, width, nxt):
    """value after change ("add:64", "set:next"...), wrapped to width bytes."""
    op, _, arg = change.partition(":")
    v = nxt if arg == "next" else int(arg, 0)
    mask = (1 << (8 * width)) - 1
    if op == "set":
        return v & mask
    if op == "add":
        return (value + v) & mask
    if op == "sub":
        return (value - v) & mask
    if op == "xor":
        return (value ^ v) & mask
    raise ValueError("unknown change %r" % change)


class TestScribbleTable(support.DaemonTest):
    DAEMON_SIZE = "4M"

    def setUp(self):
        super().setUp()
        self.assertTrue(os.access(read_tool(), os.X_OK),
                        "%s is missing: make test builds it" % read_tool())
        info = self.c.info
        self.assertGreater(info.get("catalog_slots", 0), 0, "no catalog: %r" % (info,))
        path = os.path.join(self.d.shm_dir, self.d.name)
        with open(path, "r+b") as f:
            self.m = mmap.mmap(f.fileno(), info["size"])
        self.addCleanup(self.m.close)
        self.coff, self.slots = info["catalog_offset"], info["catalog_slots"]
        self.seed = info["catalog_seed"]
        self.ro = self.d.client(name="table-ro", read_only=True)
        self.addCleanup(self.ro.close)
        # The C reader connects now, before any scribble, as the Python
        # clients did (hello repairs the header page a client scribbled).
        self.tool = subprocess.Popen([read_tool(), self.d.socket_path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.addCleanup(self.stop_tool)

    def stop_tool(self):
        self.tool.stdin.close()
        self.assertEqual(self.tool.wait(timeout=60), 0)
        self.tool.stdout.close()

    def entry_at(self, key, chunk=None):
        """The offset of key's entry (the one naming chunk, when given), or
        of its home entry when chunk is None."""
        h = C.catalog_hash(self.seed, key.encode())
        if chunk is None:
            return self.coff + (h & (self.slots - 1)) * P.CATALOG_ENTRY_SIZE, h >> 32
        for p in range(P.CATALOG_PROBES):
            at = self.coff + ((h + p) & (self.slots - 1)) * P.CATALOG_ENTRY_SIZE
            if struct.unpack_from("=Q", self.m, at + 8)[0] == chunk:
                return at, h >> 32
        self.fail("the catalog does not list %r at chunk %d" % (key, chunk))

    def put(self, key, data):
        """Put data under key; its chunk's offset."""
        return self.c.put(key, data) - P.align64(P.CHUNK_HEADER_SIZE + len(key))

    def scribble(self, where, change, victim, vchunk, nchunk, absent):
        """Apply one row's change; [(offset, old bytes)] to put back. Places
        and changes joined by '+' are several, one change per place."""
        if "+" in where or "+" in change:
            places, changes = where.split("+"), change.split("+")
            if len(places) != len(changes):
                raise ValueError("%s and %s are not as many places as changes"
                                 % (where, change))
            saved = []
            for w, c in zip(places, changes):
                saved += self.scribble(w, c, victim, vchunk, nchunk, absent)
            return saved
        if where == "-":
            return []
        if where == "forge":
            at, tag = self.entry_at(absent)
            ventry, _ = self.entry_at(victim, vchunk)
            old = bytes(self.m[at:at + 32])
            _seq, _h, chunk, gen, _f, size = P.CATALOG_ENTRY.unpack_from(self.m, ventry)
            P.CATALOG_ENTRY.pack_into(self.m, at, 2, tag, chunk, gen, 0, size)
            return [(at, old)]
        area, _, field = where.partition(".")
        if area == "entry":
            base, _ = self.entry_at(victim, vchunk)
            off, width = ENTRY_FIELDS[field]
        elif area == "header":
            base = 0
            off, width = HEADER_FIELDS[field]
        elif area == "chunk" and field in ("key", "key_last"):
            base = vchunk + P.CHUNK_HEADER_SIZE
            off, width = (0 if field == "key" else len(victim) - 1), 1
        elif area == "chunk":
            base = vchunk
            off, width = CHUNK_FIELDS[field]
        elif where.startswith("chunk@"):
            base, off, width = vchunk, int(where[6:], 0), 1
        else:
            raise ValueError("unknown place %r" % where)
        at = base + off
        old = bytes(self.m[at:at + width])
        value = changed(int.from_bytes(old, "little"), change, width, nchunk)
        self.m[at:at + width] = value.to_bytes(width, "little")
        return [(at, old)]

    def py_read(self, client, key):
        """(outcome, bytes or None, copies redone) of Client.read."""
        before = client.read_stats()
        try:
            got = client.read(key)
        except shmbroker.NotFound:
            got = None
        after = client.read_stats()
        by_daemon = after["fallback"] > before["fallback"]
        retries = after["retries"] - before["retries"]
        if got is None:
            return ("daemon-notfound" if by_daemon else "notfound"), None, retries
        return ("daemon" if by_daemon else "hit"), got, retries

    def c_reads(self, key):
        """{mode: (outcome, bytes or None, copies redone)} of shmb-read-tool's
        handles."""
        self.tool.stdin.write(key + "\n")
        self.tool.stdin.flush()
        found = {}
        for _ in range(2):
            line = self.tool.stdout.readline()
            self.assertTrue(line, "shmb-read-tool ended (status %r)" % self.tool.poll())
            k, mode, outcome, _size, hexed, retries = line.split()
            self.assertEqual(k, key)
            found[mode] = (outcome, None if hexed == "-" else bytes.fromhex(hexed),
                           int(retries))
        self.assertEqual(sorted(found), ["ro", "rw"])
        return found

    def test_table(self):
        """Every row: Python and C, read-write and read-only, the row's
        outcome with the victim's exact bytes, never another key's; and no
        copy redone. Nothing changes under these reads, so a reader that
        redid one copied a chunk a check before the copy should have turned
        away (the seal's generation, the state, the key), and only the
        checks after the copy caught it: the outcome is the same, the reader
        is not, and a check dropped from one side shows here."""
        rows = load_table()
        self.assertGreater(len(rows), 30)
        wrong = []
        for i, (line, name, what, where, change, expect) in enumerate(rows):
            victim, nxt, absent = ("%s/victim" % name, "%s/next" % name,
                                   "%s/absent" % name)
            vdata, ndata = payload(i, 0), payload(i, 1)
            vchunk = self.put(victim, vdata)
            nchunk = self.put(nxt, ndata)
            saved = self.scribble(where, change, victim, vchunk, nchunk, absent)
            try:
                key = victim if what == "victim" else absent
                want = (expect, vdata if expect in ("hit", "daemon") else None, 0)
                got = {"python rw": self.py_read(self.c, key),
                       "python ro": self.py_read(self.ro, key)}
                for mode, res in self.c_reads(key).items():
                    got["C " + mode] = res
            finally:
                for at, old in reversed(saved):
                    self.m[at:at + len(old)] = old
            for reader, res in sorted(got.items()):
                if res[1] is not None and res[1] != vdata:
                    wrong.append("row %s (line %d): %s returned %d bytes that are not %s's%s"
                                 % (name, line, reader, len(res[1]), victim,
                                    " (another key's among them)" if ndata[:8] in res[1]
                                    or b"CHNK" in res[1] else ""))
                elif res[:2] != want[:2]:
                    wrong.append("row %s (line %d): %s gave %s, the table says %s"
                                 % (name, line, reader, res[0], expect))
                elif res[2] != 0:
                    wrong.append("row %s (line %d): %s redid %d copies, with nothing "
                                 "changing under it: a check before the copy let the "
                                 "scribbled chunk through" % (name, line, reader, res[2]))
            self.c.delete(victim)
            self.c.delete(nxt)
        self.assertEqual(wrong, [], "\n" + "\n".join(wrong))
        self.assertEqual(self.c.stats()["objects"], 0)


class TestScribbleTableOrdered(TestScribbleTable):
    """The same table with the Python reader of a machine without x86-64's
    ordering (acquire fences from libatomic, forced here): the same
    outcomes, and the fences are called."""

    def setUp(self):
        fence, _why = C.load_fence("aarch64")
        if fence is None:
            self.skipTest("no libatomic.so.1 here (Debian: libatomic1)")
        self.calls = [0]

        def counted():
            self.calls[0] += 1
            fence()

        saved = (C._fence, C.why_no_catalog, C._loaded)

        def restore():
            C._fence, C.why_no_catalog, C._loaded = saved

        self.addCleanup(restore)
        C._fence, C.why_no_catalog, C._loaded = counted, None, True
        super().setUp()
        self.assertIs(self.c._catalog.fence, counted)

    def test_table(self):
        super().test_table()
        self.assertGreater(self.calls[0], 4 * 40)


# ---- the storm: Python readers while a writer and a scribbler work ----------

# Half of one length (one key's entry sent to another's chunk is then seen
# only by the key bytes), half longer, of several lengths.
STORM_KEYS = ["s/%02d" % k if k < 12 else "s/%02d/" % k + "x" * (5 * k) for k in range(24)]


def storm_payload(k, version, size):
    """The bytes of key number k's version-th put: they name the key, the
    version and their own length, so that any other key's bytes, or a
    wrong length, are seen."""
    head = b"K%05dV%012dL%08d|" % (k, version, size)
    fill = bytes((k * 31 + version * 7 + i) & 0xFF for i in range(256))
    return (head + fill * (size // 256 + 1))[:size]


def storm_wrong(k, data):
    """Why data is not a payload of key number k (None: it is)."""
    try:
        kk, version, size = int(data[1:6]), int(data[7:19]), int(data[20:28])
    except ValueError:
        return "not a payload of the storm: %r" % data[:40]
    if kk != k:
        return "key %d's bytes (version %d)" % (kk, version)
    if data != storm_payload(k, version, size):
        return "%d bytes, not version %d of %d bytes" % (len(data), version, size)
    return None


def storm_writer(sock, stop):
    c = shmbroker.Client(sock)
    rnd, version = random.Random(7), 0
    while not stop.value:
        k = rnd.randrange(len(STORM_KEYS))
        try:
            c.delete(STORM_KEYS[k])
        except shmbroker.NotFound:
            pass
        version += 1
        size = 28 + (rnd.randrange(3000) if rnd.randrange(8) else rnd.randrange(60000))
        c.put(STORM_KEYS[k], storm_payload(k, version, size),
              readers=1 if rnd.randrange(6) == 0 else 0)


def storm_entry(m, coff, slots, seed, key):
    """(offset of key's entry or None, key's hash)."""
    raw = key.encode()
    h = C.catalog_hash(seed, raw)
    for p in range(P.CATALOG_PROBES):
        at = coff + ((h + p) & (slots - 1)) * 32
        _seq, tag, chunk = struct.unpack_from("=IIQ", m, at)
        if chunk == 0:
            break
        if (tag == h >> 32 and 0 < chunk < len(m) - P.CHUNK_HEADER_SIZE - len(raw)
                and m[chunk + P.CHUNK_HEADER_SIZE:chunk + P.CHUNK_HEADER_SIZE + len(raw)] == raw):
            return at, h
    return None, h


def storm_scribbler(sock, path, stop, seed):
    """Damage as a read-write client may do it, one change at a time (two
    changes that agree, an entry's size and its chunk's payload_size, say,
    are a forgery no reader can see through): the catalog's entries
    (any bytes; plausible sizes, chunks and generations; another key's
    entry; a write of its own under seq), the header page's catalog words,
    and listed chunks' headers, seals and key bytes, those for a moment."""
    c = shmbroker.Client(sock)
    info = c.info
    coff, slots, cseed = info["catalog_offset"], info["catalog_slots"], info["catalog_seed"]
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), info["size"])
    rnd = random.Random(seed)
    end = info["data_offset"] + info["data_size"]
    while not stop.value:
        key = STORM_KEYS[rnd.randrange(len(STORM_KEYS))]
        at, h = storm_entry(m, coff, slots, cseed, key)
        what, undo, keep = rnd.randrange(10), [], rnd.randrange(8) == 0
        if what == 0:  # any bytes of an entry on key's probe
            e = coff + ((h + rnd.randrange(4)) & (slots - 1)) * 32 + rnd.randrange(32)
            n = rnd.choice((1, 4, 8))
            undo.append((e, bytes(m[e:e + n])))
            m[e:e + n] = os.urandom(n)
        elif what == 1:  # a catalog word of the header page
            o = rnd.choice((P.CATALOG_OFFSET_AT, P.CATALOG_SLOTS_AT, P.CATALOG_SEED_AT,
                            P.CATALOG_MOVES_AT, P.CATALOG_UNLISTED_AT, P.SEGMENT_RETIRED_AT))
            undo.append((o, bytes(m[o:o + 4])))
            m[o:o + 4] = os.urandom(4)
            keep = False
        elif what in (2, 3) and at is not None:  # a plausible entry
            seq, tag, chunk, gen, flags, size = P.CATALOG_ENTRY.unpack_from(m, at)
            chunk, gen, size, flags = rnd.choice((
                (chunk, gen + 1, size, flags), (chunk, gen, size + 64, flags),
                (chunk, gen, max(1, size - 1), flags), (chunk + 64, gen, size, flags),
                ((1 << 64) - 64, gen, size, flags), (chunk, gen, (1 << 64) - 1, flags),
                (chunk, gen, 1 << 63, flags), (end - 64, gen, size, flags),
                (chunk, gen, size, flags ^ P.CATALOG_AWAITED)))
            undo.append((at, bytes(m[at:at + 32])))
            P.CATALOG_ENTRY.pack_into(m, at, seq, tag, chunk & ((1 << 64) - 1),
                                      gen & 0xFFFFFFFF, flags, size & ((1 << 64) - 1))
        elif what in (4, 5) and at is not None:  # a chunk's header, seal or key, a moment
            chunk = struct.unpack_from("=Q", m, at + 8)[0]
            kat = chunk + P.CHUNK_HEADER_SIZE + rnd.randrange(len(key))
            o = rnd.choice((chunk + rnd.randrange(32), chunk + P.SEAL_AT, kat))
            undo.append((o, bytes(m[o:o + 8])))
            if o == chunk + P.SEAL_AT:
                struct.pack_into("=Q", m, o, rnd.choice((0, struct.unpack_from(
                    "=Q", m, o)[0] ^ rnd.choice((1, 1 << 31)), rnd.getrandbits(64))))
            else:
                m[o] ^= 0x80 if o == kat else 1 << rnd.randrange(8)
            keep = False
        elif what in (6, 7) and at is not None:  # key's entry names another key's chunk
            other, _ = storm_entry(m, coff, slots, cseed,
                                   STORM_KEYS[rnd.randrange(len(STORM_KEYS))])
            if other is not None and other != at:
                undo.append((at, bytes(m[at:at + 32])))
                m[at + 8:at + 32] = m[other + 8:other + 32]
        elif what == 8:  # an entry of an absent key's tag naming a listed chunk
            other, _ = storm_entry(m, coff, slots, cseed,
                                   STORM_KEYS[rnd.randrange(len(STORM_KEYS))])
            ah = C.catalog_hash(cseed, b"s/absent/%d" % rnd.randrange(4))
            e = coff + (ah & (slots - 1)) * 32
            if other is not None:
                undo.append((e, bytes(m[e:e + 32])))
                struct.pack_into("=I", m, e + 4, ah >> 32)
                m[e + 8:e + 32] = m[other + 8:other + 32]
        elif at is not None:  # a write of its own under the entry's seq
            seq = struct.unpack_from("=I", m, at)[0]
            undo.append((at, bytes(m[at:at + 32])))
            struct.pack_into("=I", m, at, (seq + 1) & 0xFFFFFFFF)
            m[at + 8:at + 16] = os.urandom(8)
            struct.pack_into("=I", m, at, (seq + 2) & 0xFFFFFFFF)
        if not keep:
            for o, old in reversed(undo):
                m[o:o + len(old)] = old
    m.close()
    c.close()


def storm_reader(sock, stop, read_only, fenced, idx, reads, failures):
    """Reads of random keys (read() and read_into(), some into buffers too
    small): each one the key's bytes, BufferTooSmall or NotFound."""
    if fenced:
        fence, _why = C.load_fence("aarch64")
        if fence is not None:
            C._fence, C.why_no_catalog, C._loaded = fence, None, True
    c = shmbroker.Client(sock, read_only=read_only)
    rnd = random.Random(idx)
    buf = bytearray(64 * 1024)
    while not stop.value:
        absent = rnd.randrange(8) == 0
        k = rnd.randrange(len(STORM_KEYS))
        key = "s/absent/%d" % rnd.randrange(4) if absent else STORM_KEYS[k]
        try:
            if rnd.randrange(3) == 0:
                into = bytearray(rnd.randrange(100)) if rnd.randrange(3) == 0 else buf
                data = bytes(into[:c.read_into(key, into)])
            else:
                data = c.read(key)
        except (shmbroker.NotFound, shmbroker.BufferTooSmall):
            reads[idx] += 1
            continue
        except Exception as e:  # anything else is the failure
            failures.put("%s read of %r raised %r" % (idx, key, e))
            return
        wrong = "an absent key read" if absent else storm_wrong(k, data)
        if wrong:
            failures.put("%s read of %r returned %s" % (idx, key, wrong))
        reads[idx] += 1
    c.close()


class TestScribbleStorm(support.DaemonTest):
    """Python readers (read-write, read-only with the fences of a machine
    without TSO) while a writer deletes and puts again and a read-write
    client scribbles over the catalog, the header page and chunk headers,
    concurrently: SHMB_SCRIBBLE_SECONDS long (3 s)."""
    DAEMON_SIZE = "16M"

    def test_storm(self):
        seconds = float(os.environ.get("SHMB_SCRIBBLE_SECONDS") or 3)
        ctx = multiprocessing.get_context("fork")
        stop = ctx.Value("i", 0)
        reads = ctx.Array("q", 2, lock=False)
        failures = ctx.Queue()
        sock = self.d.socket_path
        path = os.path.join(self.d.shm_dir, self.d.name)
        for k, key in enumerate(STORM_KEYS):
            self.c.put(key, storm_payload(k, 0, 100))
        procs = [ctx.Process(target=storm_writer, args=(sock, stop)),
                 ctx.Process(target=storm_scribbler, args=(sock, path, stop, 1616)),
                 ctx.Process(target=storm_reader,
                             args=(sock, stop, False, False, 0, reads, failures)),
                 ctx.Process(target=storm_reader,
                             args=(sock, stop, True, True, 1, reads, failures))]
        for p in procs:
            p.start()
        try:
            threading.Event().wait(seconds)
        finally:
            stop.value = 1
            for p in procs:
                p.join(120)
                if p.is_alive():
                    p.kill()
                    p.join()
        wrong = []
        while not failures.empty():
            wrong.append(failures.get())
        self.assertEqual(wrong, [])
        self.assertEqual([p.exitcode for p in procs], [0, 0, 0, 0])
        self.assertTrue(all(reads[i] > 0 for i in range(2)), list(reads))
        self.assertIsNone(self.d.proc.poll(), "shmbrokerd died")
        self.assertGreaterEqual(self.c.stats()["objects"], len(STORM_KEYS) - 1)

if __name__ == "__main__":
    unittest.main()
