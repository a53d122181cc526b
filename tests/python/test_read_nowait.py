# SPDX-License-Identifier: Apache-2.0
"""Client.read() of a key the same client just put with put_nowait(), before
any later request was answered: the daemon may not have handled the put's
commit yet, so the catalog's miss proves nothing. The read looks at the
catalog again for read_wait seconds, then asks the daemon, which handles the
connection's requests in order and so answers after the commit (as
shmb_read does after shmb_put_nowait). No test asserts a duration."""

import os
import signal
import threading
import unittest

import support
from shmbroker.errors import InvalidRequest, NotFound


class TestReadAfterPutNowait(support.DaemonTest):
    DAEMON_SIZE = "16M"

    # The daemon stopped (SIGSTOP) before the put: the commit cannot land,
    # so the read asks the daemon, which answers once it runs again, with
    # the put's bytes (not NotFound).
    def test_read_of_a_put_on_its_way_asks_the_daemon(self):
        self.c.put_nowait("arena", b"x")  # the arena, granted before the stop
        self.c.sync()
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        self.c.put_nowait("w", b"on its way")
        resume = threading.Timer(0.3, os.kill, (self.d.proc.pid, signal.SIGCONT))
        resume.start()
        self.addCleanup(resume.cancel)
        self.addCleanup(os.kill, self.d.proc.pid, signal.SIGCONT)
        self.assertEqual(self.c.read("w"), b"on its way")
        self.assertEqual(self.c.read_stats()["fallback"], 1)
        # A key never put still misses (the daemon says so).
        with self.assertRaises(NotFound):
            self.c.read("never put")

    # With a wait long enough for any commit to land, every read of the put
    # just sent is served by the catalog in the mapping (no round trip).
    def test_read_waits_for_the_commit_in_the_catalog(self):
        self.c.read_wait = 1.0
        for i in range(40):
            data = bytes([i]) * (64 + i)
            self.c.put_nowait("k%d" % i, data)
            self.assertEqual(self.c.read("k%d" % i), data)
        self.assertEqual(self.c.read_stats()["fallback"], 0)
        self.assertEqual(self.c.read_stats()["fast"], 40)

    # A miss of another key while a put is unanswered asks the daemon too:
    # that key may be an earlier put of this client still on its way.
    def test_other_keys_ask_the_daemon_while_puts_are_on_their_way(self):
        self.c.put_nowait("arena", b"x")
        self.c.sync()
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        self.c.put_nowait("first", b"1")
        resume = threading.Timer(0.3, os.kill, (self.d.proc.pid, signal.SIGCONT))
        resume.start()
        self.addCleanup(resume.cancel)
        self.addCleanup(os.kill, self.d.proc.pid, signal.SIGCONT)
        self.c.put_nowait("second", b"2")
        self.assertEqual(self.c.read("first"), b"1")
        self.assertEqual(self.c.read_stats()["fallback"], 1)

    # A put of a key this client deleted without waiting just before: the
    # catalog still lists the deleted object while both are on their way,
    # and the read of the put gets the put's bytes, not the deleted ones
    # (the daemon handles the delete, then the put). It returned the
    # deleted bytes: a hit was taken for the put's own.
    def test_read_of_a_put_after_a_delete_on_its_way(self):
        self.c.put_nowait("K", b"deleted")
        self.c.sync()
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        self.c.delete("K", noreply=True)
        self.c.put_nowait("K", b"put after")
        resume = threading.Timer(0.3, os.kill, (self.d.proc.pid, signal.SIGCONT))
        resume.start()
        self.addCleanup(resume.cancel)
        self.addCleanup(os.kill, self.d.proc.pid, signal.SIGCONT)
        self.assertEqual(self.c.read("K"), b"put after")
        # A put the daemon refuses (the key holds another client's object)
        # reads as that object, as the daemon then has it.
        other = self.d.client(name="other")
        self.addCleanup(other.close)
        other.put("theirs", b"their bytes")
        self.c.put_nowait("theirs", b"ours")
        self.assertEqual(self.c.read("theirs"), b"their bytes")

    # read_wait is bounded as shmb_set_read_wait is (0 to 1 s): a NaN never
    # ends the wait (no time is past it), nor does infinity, and a read of
    # a put the daemon never handles (it died) then looked for ever. A bad
    # value is refused where it is set and the wait stays as it was.
    def test_read_wait_out_of_bounds_is_refused(self):
        self.c.read_wait = 0.5
        for bad in (float("nan"), float("inf"), -1e-6, 1.5, "0.1", None, True):
            with self.assertRaises(InvalidRequest, msg=repr(bad)):
                self.c.read_wait = bad
            self.assertEqual(self.c.read_wait, 0.5)
        for good in (0, 0.0, 1, 1.0, 200e-6):
            self.c.read_wait = good
            self.assertEqual(self.c.read_wait, good)
        # A wait of 0 asks the daemon at once, which answers with the put.
        self.c.read_wait = 0
        self.c.put_nowait("arena", b"x")
        self.c.sync()
        self.c.put_nowait("bounded", b"b")
        self.assertEqual(self.c.read("bounded"), b"b")


class TestReadAfterDeleteNoreply(support.DaemonTest):
    """read() of a key this client deleted with noreply, before any later
    request was answered, asks the daemon (which handles the delete first)
    instead of reading the object the catalog may still list."""

    DAEMON_SIZE = "16M"

    # The daemon stopped before the delete: the catalog still lists the
    # object, and the read must not give its bytes.
    def test_read_after_a_delete_on_its_way_misses(self):
        self.c.put("gone", b"old bytes")
        self.assertEqual(self.c.read("gone"), b"old bytes")
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        resume = threading.Timer(0.3, os.kill, (self.d.proc.pid, signal.SIGCONT))
        resume.start()
        self.addCleanup(resume.cancel)
        self.addCleanup(os.kill, self.d.proc.pid, signal.SIGCONT)
        self.c.delete("gone", noreply=True)
        with self.assertRaises(NotFound):
            self.c.read("gone")
        self.assertFalse(self.c._listed("gone"))

    # Once a reply came back, reads of other keys are served by the catalog
    # again (no round trip), and so past many deletes on their way.
    def test_reads_from_the_catalog_again_after_a_reply(self):
        for i in range(70):
            self.c.put("k%d" % i, b"v")
        self.c.put("kept", b"here")
        for i in range(70):
            self.c.delete("k%d" % i, noreply=True)
        before = self.c.read_stats()["fallback"]
        self.assertEqual(self.c.read("kept"), b"here")  # past 64: every key asks
        self.assertEqual(self.c.read_stats()["fallback"], before + 1)
        self.assertEqual(self.c.read("kept"), b"here")  # that reply cleared them
        self.assertEqual(self.c.read_stats()["fallback"], before + 1)
        with self.assertRaises(NotFound):
            self.c.read("k3")


if __name__ == "__main__":
    unittest.main()
