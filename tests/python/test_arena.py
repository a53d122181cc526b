# SPDX-License-Identifier: Apache-2.0
"""Client.put_nowait and sync(): puts through the connection's arena, as
client/arena.c makes them (proto/PROTOCOL.md, section 11). A put sent
without waiting is visible to a reader once a later request was answered;
it makes no alloc; a refusal is reported by the next put, which is not
made; a scribbled lock word costs an arena, not the put; a writer killed
in the middle of its puts loses nothing that was confirmed."""

import os
import signal
import time
import unittest

import support
import shmbroker
from shmbroker import _arena
from shmbroker.errors import Cancelled


def count_round_trips(client):
    """Wrap client's ways of waiting for a reply; returns the list whose
    length counts the replies waited for."""
    seen = []
    for name in ("_exchange_line", "_exchange_line_reply"):  # _arena_reply reads through the latter
        real = getattr(client, name)

        def counted(*args, _real=real, _name=name, **kw):
            seen.append(_name)
            return _real(*args, **kw)
        setattr(client, name, counted)
    return seen


class TestPutNowait(support.DaemonTest):
    DAEMON_SIZE = "16M"

    # Puts sent without waiting are committed by the daemon: a reader sees
    # every byte after the writer's sync(), the daemon made no alloc for
    # them, and the writer waited for one reply only (its arena's).
    def test_visible_after_sync_without_allocs(self):
        reader = self.d.client(read_only=True)
        self.addCleanup(reader.close)
        trips = count_round_trips(self.c)
        values = {"k%d" % i: os.urandom(100 + 37 * i) for i in range(50)}
        for key, value in values.items():
            self.c.put_nowait(key, value, readers=1)
        self.assertEqual(len(trips), 1, trips)  # the first arena
        self.c.sync()
        for key, value in values.items():
            self.assertEqual(reader.read(key), value)
        counters = self.c.stats()["counters"]
        self.assertEqual(counters["allocs"], 0)
        self.assertGreaterEqual(counters["commits"], 50)

    # The frames layout goes through the arena as put() writes it.
    def test_frames(self):
        self.c.put_nowait("f", [b"ab", b"cde"])
        self.c.sync()
        self.assertEqual(self.c.read_frames("f"), [b"ab", b"cde"])

    # A put the daemon refused (its key taken) is reported by the next put,
    # once a reply told of it; that put is not made, and the one after is.
    def test_refusal_reported_on_next_put(self):
        self.c.put("taken", b"first")
        self.c.put_nowait("taken", b"second")
        self.c.put_nowait("after", b"a")
        self.assertTrue(self.c.contains("after"))  # a reply: the refusal is told
        with self.assertRaises(Cancelled) as cm:
            self.c.put_nowait("next", b"n")
        self.assertEqual(cm.exception.code, "ECANCELED")
        self.assertIn("'taken'", cm.exception.message)
        self.assertIn("EEXIST", cm.exception.message)
        self.assertIn("'next' was not made", cm.exception.message)
        self.assertFalse(self.c.contains("next"))
        self.assertEqual(self.c.read("taken"), b"first")
        self.c.put_nowait("next", b"n")
        self.c.sync()
        self.assertEqual(self.c.read("next"), b"n")
        self.assertEqual(self.c.read("after"), b"a")

    # sync() reports a refusal itself, and then nothing more.
    def test_sync_reports(self):
        self.c.put("taken", b"first")
        self.c.put_nowait("taken", b"second")
        with self.assertRaises(Cancelled):
            self.c.sync()
        self.c.sync()

    # A client that scribbled over its arena's lock word (or an arena the
    # daemon took back) loses that arena, not the put: it asks for another.
    def test_scribbled_lock_word(self):
        self.c.put_nowait("a", b"1" * 100)
        lock = self.c._arena.lock_at()
        first = self.c._arena.offset
        self.c._mv[lock:lock + 8] = (12345 << 2 | _arena.REVOKED).to_bytes(8, "little")
        self.c.put_nowait("b", b"2" * 100)
        self.assertNotEqual(self.c._arena.offset, first)
        self.c.sync()
        self.assertEqual(self.c.read("a"), b"1" * 100)
        self.assertEqual(self.c.read("b"), b"2" * 100)

    # Many arenas' worth of puts, some larger than the default arena: each
    # lands whole.
    def test_many_arenas(self):
        values = {}
        for i in range(300):
            values["m%d" % i] = bytes([i % 251]) * (1 + (i * 7919) % 40000)
            self.c.put_nowait("m%d" % i, values["m%d" % i])
        self.c.sync()
        for key, value in values.items():
            self.assertEqual(self.c.read(key), value)

    # The put whose commit asks for the next arena does not wait for that
    # arena: with the daemon stopped (SIGSTOP), puts go on until the arena
    # held runs low, the last of them sending the request; once the daemon
    # runs again, the next put takes the arena granted, and every object
    # lands whole.
    def test_next_arena_not_waited_for(self):
        import threading
        self.c.put_nowait("first", b"f" * 100)  # the first arena, waited for
        self.assertGreater(self.c._arena.size, 0)
        values = {}
        done = []

        def puts():
            for i in range(1000):  # bounded; the arena runs low long before
                key = "s%d" % i
                values[key] = bytes([i % 251]) * 16000
                self.c.put_nowait(key, values[key])
                if self.c._arena.size == 0:  # this put asked for the next one
                    break
            done.append(True)

        os.kill(self.d.proc.pid, signal.SIGSTOP)
        try:
            writer = threading.Thread(target=puts, daemon=True)
            writer.start()
            writer.join(20)
            stopped_done = bool(done)
        finally:
            os.kill(self.d.proc.pid, signal.SIGCONT)
        writer.join(20)
        self.assertTrue(stopped_done, "a put waited for the stopped daemon")
        self.c.put_nowait("after", b"a" * 100)  # takes the arena asked for
        self.assertGreater(self.c._arena.size, 0)
        self.c.sync()
        values["first"], values["after"] = b"f" * 100, b"a" * 100
        for key, value in values.items():
            self.assertEqual(self.c.read(key), value)

    # A read-only client has no arena: put_nowait says so, nothing sent.
    def test_read_only(self):
        reader = self.d.client(read_only=True)
        self.addCleanup(reader.close)
        with self.assertRaises(shmbroker.ShmBrokerError) as cm:
            reader.put_nowait("x", b"1")
        self.assertEqual(cm.exception.code, "ENOSYS")

    # A writer killed while it puts without waiting loses nothing that a
    # reply confirmed: every key it reported after a sync() is whole, and
    # the daemon goes on serving.
    def test_killed_writer_keeps_confirmed(self):
        code = ("import sys, shmbroker\n"
                "c = shmbroker.Client(sys.argv[1])\n"
                "i = 0\n"
                "while True:\n"
                "    c.put_nowait('w%d' % i, bytes([i % 256]) * (1000 + i % 5000), readers=1)\n"
                "    i += 1\n"
                "    if i % 20 == 0:\n"
                "        c.sync()\n"
                "        print(i, flush=True)\n")
        child = support.child_python(code, self.d.socket_path)
        confirmed = 0
        deadline = time.monotonic() + 30
        while confirmed < 400 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            confirmed = int(line)
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stderr.close()
        child.stdin.close()
        self.assertGreaterEqual(confirmed, 400)
        for i in range(confirmed):
            self.assertEqual(self.c.read("w%d" % i), bytes([i % 256]) * (1000 + i % 5000))
        self.c.put("after", b"ok")
        self.assertEqual(self.c.read("after"), b"ok")



def publish(client, key, data, readers=0):
    """A put published in the client's arena (what the vLLM store drop-in
    does): its payload offset and chunk id."""
    return client._put_arena(key, data, len(data), readers, True, publish=True)


class TestPublish(support.DaemonTest):
    DAEMON_SIZE = "16M"

    # A writer killed right after its puts were published (nothing sent
    # for them): the daemon folds them when the connection goes, so that
    # they are not lost with the writer.
    def test_killed_writer_keeps_what_it_published(self):
        code = ("import os, signal, sys\n"
                "import shmbroker\n"
                "c = shmbroker.Client(sys.argv[1])\n"
                "c.put('before', b'b')\n"
                "for i in range(5):\n"
                "    c._put_arena('pub%d' % i, bytes([i]) * 3000, 3000, 0, True, publish=True)\n"
                "os.kill(os.getpid(), signal.SIGKILL)\n")
        child = support.child_python(code, self.d.socket_path)
        self.assertEqual(child.wait(30), -signal.SIGKILL)
        for f in (child.stdout, child.stderr, child.stdin):
            f.close()
        for i in range(5):
            self.assertEqual(self.c.read("pub%d" % i), bytes([i]) * 3000)

    # Another client's request to the daemon folds what was published (its
    # read from the catalog may miss it before: as for a noreply commit_at,
    # the catalog lists it once a request was handled); a published put whose key another client took is refused at
    # the fold, told with the writer's next reply, and its chunk freed.
    def test_folded_for_anyone_refused_told(self):
        other = self.d.client()
        self.addCleanup(other.close)
        publish(self.c, "mine", b"m" * 100)
        self.assertTrue(other.contains("mine"))
        self.assertEqual(other.read("mine"), b"m" * 100)
        other.put("taken", b"theirs")
        offset, _ = publish(self.c, "taken", b"x" * 100)
        self.assertEqual(self.c._mv[offset - 64 + 4], 6)  # WRITTEN until folded
        with self.assertRaises(Cancelled) as cm:
            self.c.sync()
        self.assertIn("'taken'", cm.exception.message)
        self.assertIn("EEXIST", cm.exception.message)
        self.assertEqual(other.read("taken"), b"theirs")
        self.assertEqual(self.c._mv[offset - 64 + 4], 4)  # FREE
        publish(self.c, "next", b"n")
        self.assertTrue(other.contains("next"))

    # A writer that scribbles the published end of its arena (past the
    # arena, garbage chunks) harms nobody else: the daemon folds nothing of
    # it, keeps serving, and takes the arena back on a malformed chunk.
    def test_scribbled_published_end(self):
        other = self.d.client()
        self.addCleanup(other.close)
        publish(self.c, "good", b"g" * 64)
        arena = self.c._arena
        word = arena.offset - 64 + _arena.PUBLISHED_AT
        # A chunk of garbage where the next would go, published.
        self.c._mv[arena.cursor:arena.cursor + 256] = b"\xff" * 256
        self.c._mv[word:word + 8] = (arena.cursor + 256).to_bytes(8, "little")
        self.assertTrue(other.contains("good"))
        with self.assertRaises(Cancelled) as cm:
            self.c.sync()
        self.assertIn("was not folded", cm.exception.message)
        self.c._mv[word:word + 8] = (2 ** 63).to_bytes(8, "little")
        other.put("still", b"serving")
        self.assertEqual(other.read("still"), b"serving")
        publish(self.c, "again", b"a")  # a new arena
        self.assertTrue(other.contains("again"))


if __name__ == "__main__":
    unittest.main()
