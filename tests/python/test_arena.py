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


if __name__ == "__main__":
    unittest.main()
