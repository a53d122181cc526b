# SPDX-License-Identifier: Apache-2.0
"""Published puts (proto/PROTOCOL.md, section 11, "Publishing") against a
real daemon, attacked as a hostile client and a careless user would: a
client that mixes commit_at and publishing in one arena, a published end
moved anywhere, headers and keys scribbled, a writer killed between each
two steps of a publish, a daemon killed with published chunks not folded.
Each case checks what the others see: the daemon serving, replies that
parse, a refusal told once, every object a writer was told was made, with
its bytes, nobody else's data touched."""

import os
import signal
import struct
import unittest

import support
import shmbroker
from shmbroker import _arena
from shmbroker import _protocol as P
from shmbroker.errors import Cancelled


def publish(client, key, data, readers=0):
    """A put published in the client's arena (the vLLM store drop-in's
    way): its payload offset and chunk id."""
    return client._put_arena(key, data, len(data), readers, True, publish=True)


def published_word(client):
    """The offset in the mapping of the published end of client's arena."""
    return client._arena.offset - P.ALIGN + _arena.PUBLISHED_AT


def set_word(client, at, value):
    client._mv[at:at + 8] = struct.pack("<Q", value)


def raw_publish(client, key_raw, data, **fields):
    """Lay out a chunk at the cursor of client's arena with the header a
    hostile client chooses (fields override those of a sound published
    chunk) and move the published end past it, as Arena.publish would
    (without its lock: a scribbler). Returns the chunk's offset."""
    a = client._arena
    at = a.cursor
    hsize = P.align64(P.CHUNK_HEADER_SIZE + len(key_raw))
    chunk = hsize + P.align64(len(data))
    f = dict(magic=P.CHUNK_MAGIC, state=P.CHUNK_WRITTEN, key_len=len(key_raw),
             header_size=hsize, tag=0, id=a.chunk_id, chunk_size=chunk,
             payload_size=len(data), seal=a.gen + 1)
    f.update(fields)
    mv = client._mv
    mv[at + hsize:at + hsize + len(data)] = data
    P.CHUNK_HEADER.pack_into(mv, at, f["magic"], f["state"], f["key_len"], f["header_size"],
                             f["tag"], f["id"], f["chunk_size"], f["payload_size"], f["seal"])
    mv[at + P.CHUNK_HEADER_SIZE:at + P.CHUNK_HEADER_SIZE + len(key_raw)] = key_raw
    set_word(client, published_word(client), at + chunk)
    a.gen += 1
    a.cursor = a.published = at + chunk
    client._unconfirmed[0] += 1  # as a publish: sync() asks the daemon
    return at


class TestPublishAttacks(support.DaemonTest):
    DAEMON_SIZE = "4M"

    def other(self, **kw):
        c = self.d.client(**kw)
        self.addCleanup(c.close)
        return c

    def assert_serving(self, client, key):
        """Another client can still put and read, and the daemon is alive."""
        client.put(key, b"s" * 1000)
        self.assertEqual(client.read(key), b"s" * 1000)
        self.assertIsNone(self.d.proc.poll(), self.d.log())

    # One connection that puts both ways into the same arena (put_nowait's
    # commit_at, then a published put behind it): the daemon folds what was
    # published once the commit_at has landed; both objects are made,
    # nothing is refused, the arena stays the writer's.
    # (The daemon is stopped meanwhile, so that it reads each commit_at
    # after the chunks published behind it, as a busy daemon would.)
    def test_commit_at_and_publish_in_one_arena(self):
        reader = self.other()
        values = {}
        publish(self.c, "arena", b"taken")  # the arena is had before the stop
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        try:
            for i in range(6):
                key = "mix%d" % i
                values[key] = os.urandom(200 + 31 * i)
                if i % 2:
                    publish(self.c, key, values[key])
                else:
                    self.c.put_nowait(key, values[key])
        finally:
            os.kill(self.d.proc.pid, signal.SIGCONT)
        self.c.sync()  # raises Cancelled when one was refused
        for key, value in values.items():
            self.assertEqual(reader.read(key), value, key)
        self.assertEqual(self.c.stats()["counters"]["allocs"], 0)

    # A published end moved backwards, to the closed mark's neighbour, past
    # the arena, unaligned inside a chunk, into another client's arena: the
    # daemon folds nothing of it (a chunk cut by the end is malformed, told
    # once), keeps serving, and the other client's published puts are its
    # own, with their bytes.
    def test_published_end_anywhere(self):
        victim = self.other()
        publish(victim, "victim", b"v" * 3000)
        publish(self.c, "first", b"f" * 100)
        self.c.sync()
        word = published_word(self.c)
        a = self.c._arena
        for n, value in enumerate((a.offset, a.offset - 64, 2 ** 64 - 2, a.offset + a.size + 64,
                      victim._arena.offset + victim._arena.size, victim._arena.cursor + 4096,
                      0)):
            set_word(self.c, word, value)
            self.assert_serving(self.other(), "s%d" % n)
            self.c.sync()  # nothing to tell
        # A published end inside a chunk laid out at the cursor.
        set_word(self.c, word, a.cursor)
        raw_publish(self.c, b"cut", b"c" * 500)
        set_word(self.c, word, a.cursor - 256)
        with self.assertRaises(Cancelled) as cm:
            self.c.sync()
        self.assertIn("was not folded", cm.exception.message)
        self.c.sync()  # told once
        self.assert_serving(self.other(), "after-cut")
        self.assertEqual(victim.read("victim"), b"v" * 3000)
        self.assertFalse(victim.contains("cut"))
        publish(victim, "victim2", b"w" * 10)
        victim.sync()
        self.assertEqual(self.other().read("victim2"), b"w" * 10)
        # The scribbler goes on in a new arena.
        publish(self.c, "again", b"a" * 10)
        self.c.sync()
        self.assertEqual(victim.read("again"), b"a" * 10)

    # Keys that are not UTF-8 or hold a NUL, published raw: refused, told
    # once with the next reply, which parses (a reply is UTF-8 JSON); the
    # chunk after one is folded.
    def test_bad_keys_told_once(self):
        publish(self.c, "first", b"f")
        for raw in (b"\xff\xfe", b"a\x00b", b"\xed\xa0\x80", b"x" * 200 + b"\xc3"):
            raw_publish(self.c, raw, b"bad")
            raw_publish(self.c, b"next-" + str(len(raw)).encode() + raw[:1].hex().encode(),
                        b"ok")
            with self.assertRaises(Cancelled) as cm:
                self.c.sync()
            self.assertIn("EINVAL", cm.exception.message)
            self.c.sync()  # told once
            self.assertTrue(self.c.contains(
                "next-" + str(len(raw)) + raw[:1].hex()))
        self.assert_serving(self.other(), "serving")

    # A writer killed (SIGKILL) between each two steps of a publish: after
    # the payload, after the header, after the swap of the published end,
    # after the lock is let go. What it published is kept with its bytes;
    # what it did not is not an object; either way other clients fill the
    # whole ring past its arena afterwards.
    def test_writer_killed_at_every_step(self):
        for step in (1, 2, 3, 4):
            with self.subTest(step=step):
                self._killed_at(step)

    def _killed_at(self, step):
        """A child publishes 'kept' whole, then 'victim%d' step by step,
        killing itself after the given step (1 payload, 2 header, 3 swap of
        the published end, 4 lock let go)."""
        code = (
            "import os, signal, struct, sys\n"
            "import shmbroker\n"
            "from shmbroker import _arena, _protocol as P\n"
            "step = int(sys.argv[2])\n"
            "c = shmbroker.Client(sys.argv[1])\n"
            "c._put_arena('kept%d' % step, b'k' * 5000, 5000, 0, True, publish=True)\n"
            "a = c._arena\n"
            "mv = c._mv\n"
            "lock = a.offset - P.ALIGN + P.SEAL_AT\n"
            "pub = a.offset - P.ALIGN + _arena.PUBLISHED_AT\n"
            "idle = (a.token & ~3) | _arena.IDLE\n"
            "busy = (a.token & ~3) | _arena.BUSY\n"
            "assert struct.unpack_from('<Q', mv, lock)[0] == idle\n"
            "struct.pack_into('<Q', mv, lock, busy)\n"
            "key = b'victim%d' % step\n"
            "at = a.cursor\n"
            "hsize = P.align64(P.CHUNK_HEADER_SIZE + len(key))\n"
            "chunk = hsize + P.align64(7000)\n"
            "mv[at + hsize:at + hsize + 7000] = b'v' * 7000\n"
            "if step == 1: os.kill(os.getpid(), signal.SIGKILL)\n"
            "P.CHUNK_HEADER.pack_into(mv, at, P.CHUNK_MAGIC, P.CHUNK_WRITTEN, len(key), hsize,\n"
            "                         0, a.chunk_id, chunk, 7000, a.gen + 1)\n"
            "mv[at + P.CHUNK_HEADER_SIZE:at + P.CHUNK_HEADER_SIZE + len(key)] = key\n"
            "if step == 2: os.kill(os.getpid(), signal.SIGKILL)\n"
            "assert struct.unpack_from('<Q', mv, pub)[0] == a.published\n"
            "struct.pack_into('<Q', mv, pub, at + chunk)\n"
            "if step == 3: os.kill(os.getpid(), signal.SIGKILL)\n"
            "struct.pack_into('<Q', mv, lock, idle)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
        child = support.child_python(code, self.d.socket_path, str(step))
        self.assertEqual(child.wait(30), -signal.SIGKILL)
        for f in (child.stdout, child.stderr, child.stdin):
            if f is not None:
                f.close()
        reader = self.other()
        self.assertEqual(reader.read("kept%d" % step), b"k" * 5000)
        if step >= 3:
            self.assertEqual(reader.read("victim%d" % step), b"v" * 7000)
        else:
            self.assertFalse(reader.contains("victim%d" % step))
        # The ring comes round past the dead writer's arena.
        filler = self.other()
        for i in range(80):
            filler.put("fill%d-%d" % (step, i), b"x" * 100000)
        self.assertFalse(reader.contains("kept%d" % step))
        self.assertIsNone(self.d.proc.poll(), self.d.log())


def value_of(key, size):
    """The bytes a writer of the crowd puts under key."""
    seed = key.encode()
    return (seed * (size // len(seed) + 1))[:size]


class TestPublishCrowd(support.DaemonTest):
    DAEMON_SIZE = "4M"

    # Writers publishing at once (two of them from two connections of one
    # process) while another client puts large objects that make the ring
    # come round over their arenas: every writer finishes, no put is
    # refused, and every object found has its own bytes.
    def test_publishers_and_evictions(self):
        writer = (
            "import sys\n"
            "import shmbroker\n"
            "def value_of(key, size):\n"
            "    seed = key.encode()\n"
            "    return (seed * (size // len(seed) + 1))[:size]\n"
            "conns = [shmbroker.Client(sys.argv[1]) for _ in range(int(sys.argv[3]))]\n"
            "for i in range(400):\n"
            "    c = conns[i % len(conns)]\n"
            "    key = '%s-%d' % (sys.argv[2], i)\n"
            "    data = value_of(key, 100 + (i * 977) % 20000)\n"
            "    c._put_arena(key, data, len(data), 0, True, publish=True)\n"
            "    if i % 50 == 49:\n"
            "        c.sync()\n"
            "for c in conns:\n"
            "    c.sync()\n"
            "print('done')\n")
        filler = (
            "import sys\n"
            "import shmbroker\n"
            "c = shmbroker.Client(sys.argv[1])\n"
            "for i in range(12):\n"
            "    c.put('big-%d' % i, bytes([i % 256]) * 200000)\n"
            "print('done')\n")
        kids = [support.child_python(writer, self.d.socket_path, "w%d" % n, str(1 + n % 2))
                for n in range(3)]
        kids.append(support.child_python(filler, self.d.socket_path))
        for kid in kids:
            out, err = kid.communicate(timeout=120)
            self.assertEqual(kid.returncode, 0, err.decode(errors="replace"))
            self.assertEqual(out.strip(), b"done")
        reader = self.d.client()
        self.addCleanup(reader.close)
        found = 0
        for n in range(3):
            for i in range(400):
                key = "w%d-%d" % (n, i)
                if reader.contains(key):
                    try:
                        got = reader.read(key)
                    except shmbroker.NotFound:
                        continue  # evicted in between
                    self.assertEqual(got, value_of(key, 100 + (i * 977) % 20000), key)
                    found += 1
        self.assertGreater(found, 0)
        self.assertEqual(reader.stats()["counters"]["noreply_errors"], 0)
        self.assertIsNone(self.d.proc.poll(), self.d.log())


class TestPublishAdoption(unittest.TestCase):
    """A daemon killed while published chunks wait for their fold, its
    successor adopting the segment."""

    def setUp(self):
        self.d = support.Daemon("4M").start()
        self.addCleanup(self.d.cleanup)

    # Published and not folded when the daemon died: adopted with their
    # bytes; a published end scribbled before the death (inside a chunk,
    # past the arena, at UINT64_MAX - 1) costs the writer what lies past a
    # sound chunk, never the daemon nor the others' objects.
    def test_adopts_published_hostile_end(self):
        for case, delta in (("sound", None), ("cut", -256), ("past", 1 << 30),
                            ("max", None)):
            with self.subTest(case=case):
                other = self.d.client()
                other.put("theirs-" + case, b"t" * 2000)
                w = self.d.client()
                publish(w, "w1-" + case, b"1" * 3000)
                w.sync()  # w1 folded
                os.kill(self.d.proc.pid, signal.SIGSTOP)
                try:
                    publish(w, "w2-" + case, b"2" * 3000)
                    publish(w, "w3-" + case, b"3" * 3000)
                    word = published_word(w)
                    end = struct.unpack_from("<Q", w._mv, word)[0]
                    if case == "max":
                        set_word(w, word, 2 ** 64 - 2)
                    elif delta is not None:
                        set_word(w, word, end + delta)
                finally:
                    self.restart_stopped()
                w.close()
                other.close()
                c = self.d.client()
                try:
                    self.assertEqual(c.read("theirs-" + case), b"t" * 2000)
                    self.assertEqual(c.read("w1-" + case), b"1" * 3000)
                    if case == "sound":
                        self.assertEqual(c.read("w2-" + case), b"2" * 3000)
                        self.assertEqual(c.read("w3-" + case), b"3" * 3000)
                    elif case == "cut":
                        self.assertEqual(c.read("w2-" + case), b"2" * 3000)
                        self.assertFalse(c.contains("w3-" + case))
                    else:
                        self.assertFalse(c.contains("w2-" + case))
                    c.put("after-" + case, b"a" * 100)
                    self.assertEqual(c.read("after-" + case), b"a" * 100)
                finally:
                    c.close()

    def restart_stopped(self):
        """Kill the stopped daemon and start its successor."""
        self.d.proc.kill()
        self.d.proc.wait()
        self.d.start()


if __name__ == "__main__":
    unittest.main()
