# SPDX-License-Identifier: Apache-2.0
"""Client.read when the daemon stopped serving the segment the client maps:
a clean stop, a kill and a start with --fresh, a memfd pool started again
by hand, the socket unit's stop (SIGTERM with --keep-segment, then
--remove-segment), each followed by a new daemon on the same socket. The
old client's read fails (ConnectionLost, ECONNRESET, then ENOTCONN) instead
of answering the old bytes or a miss for a key put since; after reconnect()
it reads the new daemon's objects. A retired word scribbled by a read-write
client only sends reads to the daemon."""

import os
import signal
import struct
import subprocess
import threading
import time
import unittest

import support
import shmbroker

# Far longer than the bound README states, so that a loaded machine does
# not fail the tests; a reader that never notices fails them.
GIVE_UP_S = 5.0
# Where the header keeps the word a daemon sets when it gives a segment up
# (proto/layout.h: struct shmb_segment_header.retired).
RETIRED_AT = 140


def process_state(pid):
    """The state letter of process pid (/proc/PID/stat): "T" once stopped."""
    with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


class TestLiveness(unittest.TestCase):
    def daemon(self, size="4M", args=()):
        d = support.Daemon(size, args)
        self.addCleanup(d.cleanup)
        return d

    def again(self, old, args=None):
        """A new daemon of the same name, socket and shm directory as old."""
        d = support.Daemon(old.size, old.args if args is None else args,
                           workdir=old.dir, shm_dir=old.shm_dir)
        d.name, d.socket_path, d.log_path = old.name, old.socket_path, old.log_path
        self.addCleanup(d.cleanup)
        return d

    def client(self, d, **kw):
        c = d.client(**kw)
        self.addCleanup(c.close)
        return c

    def assert_lost(self, c, key):
        """The next read fails with ECONNRESET saying to reconnect; later
        ones fail too."""
        with self.assertRaises(shmbroker.ConnectionLost) as cm:
            c.read(key)
        self.assertEqual(cm.exception.code, "ECONNRESET")
        self.assertIn("reconnect", cm.exception.message)
        for _ in range(3):
            with self.assertRaises(shmbroker.ConnectionLost) as cm:
                c.read(key)
            self.assertEqual(cm.exception.code, "ENOTCONN")

    def assert_lost_soon(self, c, key):
        """Reads may answer from the mapping (the old bytes, or a miss)
        until the client's next look at its connection; then they fail, as
        assert_lost."""
        end = time.monotonic() + GIVE_UP_S
        while True:
            try:
                c.read(key)
            except shmbroker.NotFound:
                pass
            except shmbroker.ConnectionLost as e:
                self.assertEqual(e.code, "ECONNRESET")
                self.assertIn("reconnect", e.message)
                break
            self.assertLess(time.monotonic(), end, "read() of %r still answers from the "
                            "mapping %.0f s after its daemon went" % (key, GIVE_UP_S))
            time.sleep(0.001)
        with self.assertRaises(shmbroker.ConnectionLost) as cm:
            c.read(key)
        self.assertEqual(cm.exception.code, "ENOTCONN")

    def put_new(self, d, **kw):
        w = self.client(d, name="writer2", **kw)
        w.put("k", b"new value")
        w.put("new", b"put after the restart")
        return w

    def assert_reads_new(self, c):
        c.reconnect()
        self.assertEqual(c.read("k"), b"new value")
        self.assertEqual(c.read("new"), b"put after the restart")

    def test_clean_stop(self):
        d = self.daemon().start()
        w = self.client(d, name="writer")
        ro, rw = self.client(d, read_only=True), self.client(d)
        w.put("k", b"old value")
        self.assertEqual(ro.read("k"), b"old value")
        self.assertEqual(rw.read("k"), b"old value")
        self.assertEqual(d.stop(), 0)
        self.put_new(self.again(d).start())
        self.assert_lost(ro, "k")
        self.assert_lost(rw, "new")
        self.assert_reads_new(ro)
        self.assert_reads_new(rw)

    def test_kill_fresh(self):
        d = self.daemon().start()
        w = self.client(d, name="writer")
        ro = self.client(d, read_only=True)
        w.put("k", b"old value")
        self.assertEqual(ro.read("k"), b"old value")
        d.kill()
        self.put_new(self.again(d).start(["--fresh"]))
        self.assert_lost(ro, "new")
        self.assert_lost(w, "k")
        self.assert_reads_new(ro)

    def test_kill_alone(self):
        """No daemon after the kill: nothing marks the segment, the client
        finds out from its connection."""
        d = self.daemon().start()
        ro = self.client(d, read_only=True)
        self.client(d).put("k", b"old value")
        self.assertEqual(ro.read("k"), b"old value")
        d.kill()
        self.assert_lost_soon(ro, "k")

    def test_memfd_restart(self):
        args = ["--pool", "mem:4M,backing=memfd"]
        d = self.daemon("1M", args).start()
        w = self.client(d, name="writer", pool="mem")
        ro = self.client(d, read_only=True, pool="mem")
        self.assertEqual(ro.info["backing"], "memfd")
        w.put("k", b"old value")
        self.assertEqual(ro.read("k"), b"old value")
        d.kill()
        d2 = self.again(d).start()
        self.put_new(d2, pool="mem")
        self.assert_lost_soon(ro, "new")
        self.assert_reads_new(ro)
        self.assertEqual(d2.stop(), 0)
        self.assert_lost(ro, "k")

    def test_socket_unit_stop(self):
        """What `systemctl stop shmbrokerd.socket` does: SIGTERM to the
        service (run with --keep-segment), then ExecStopPost's
        --remove-segment."""
        d = self.daemon(args=["--keep-segment"]).start()
        ro, rw = self.client(d, read_only=True), self.client(d)
        rw.put("k", b"old value")
        self.assertEqual(ro.read("k"), b"old value")
        self.assertEqual(d.stop(), 0)
        seg = os.path.join(d.shm_dir, d.name)
        self.assertTrue(os.path.exists(seg))
        self.assert_lost(rw, "k")  # kept, but given up
        run = subprocess.run([support.daemon_binary(), "--socket", d.socket_path, "--name",
                              d.name, "--size", d.size, "--shm-dir", d.shm_dir,
                              "--remove-segment"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=30)
        self.assertEqual(run.returncode, 0, run.stdout)
        self.assertFalse(os.path.exists(seg))
        self.put_new(self.again(d).start())
        self.assert_lost(ro, "new")
        self.assert_reads_new(ro)
        self.assert_reads_new(rw)

    def test_reconnect_in_another_thread(self):
        """A client shared by two threads, one reading and one calling
        reconnect() after the daemon was replaced (a memfd pool: nothing
        marks the old segment): while the reconnect waits for hello, the
        read is refused (EBUSY, as any call while another thread's runs)
        instead of answering from the old mapping with the new connection's
        look at the socket. The new daemon is stopped (SIGSTOP) so that the
        reconnect stays in its hello."""
        args = ["--pool", "mem:4M,backing=memfd"]
        d = self.daemon("1M", args).start()
        c = self.client(d, read_only=True, pool="mem")
        self.client(d, name="writer", pool="mem").put("k", b"old value")
        self.assertEqual(c.read("k"), b"old value")
        d.kill()
        d2 = self.again(d).start()
        self.put_new(d2, pool="mem")
        self.assert_lost_soon(c, "k")
        d2.proc.send_signal(signal.SIGSTOP)
        stopped = True
        end = time.monotonic() + GIVE_UP_S
        while process_state(d2.proc.pid) != "T":  # the signal is delivered
            self.assertLess(time.monotonic(), end, "shmbrokerd did not stop")
            time.sleep(0.001)
        errs = []

        def reconnect():
            try:
                c.reconnect()
            except Exception as e:  # reported by the main thread
                errs.append(e)
        t = threading.Thread(target=reconnect)
        try:
            t.start()
            end = time.monotonic() + GIVE_UP_S
            while True:  # ENOTCONN until the other thread's reconnect begins
                try:
                    got = c.read("k")
                except shmbroker.ShmBrokerError as e:
                    got = e.code
                if got != "ENOTCONN":
                    break
                self.assertLess(time.monotonic(), end, "reconnect() did not begin")
                time.sleep(0.001)
            self.assertNotEqual(got, b"old value", "read() answered from the segment of "
                                "the daemon that was killed")
            self.assertEqual(got, "EBUSY")
            d2.proc.send_signal(signal.SIGCONT)
            stopped = False
            t.join(GIVE_UP_S)
        finally:
            if stopped:
                d2.proc.send_signal(signal.SIGCONT)
            t.join(GIVE_UP_S)
        self.assertFalse(t.is_alive())
        self.assertEqual(errs, [])
        self.assertEqual(c.read("k"), b"new value")

    def test_scribbled_word(self):
        """A read-write client writes the retired word of a segment that is
        still served: reads go to the daemon and are right."""
        d = self.daemon().start()
        ro = self.client(d, read_only=True)
        self.client(d).put("k", b"value")
        with open(os.path.join(d.shm_dir, d.name), "r+b") as f:
            f.seek(RETIRED_AT)
            f.write(struct.pack("=I", 0xDEADBEEF))
        before = ro.read_stats()
        self.assertEqual(ro.read("k"), b"value")
        with self.assertRaises(shmbroker.NotFound):
            ro.read("absent")
        after = ro.read_stats()
        self.assertEqual(after["fallback"], before["fallback"] + 2)
        self.assertEqual(after["fast"], before["fast"])


if __name__ == "__main__":
    unittest.main()
