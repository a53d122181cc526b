# SPDX-License-Identifier: Apache-2.0
"""shmbrokerctl status --from-segment finds the segment of the daemon at its
socket among several daemons' and a pool's by the pool's name, and says which
segment it read and how it chose it."""

import os
import re
import shutil
import subprocess
import unittest

import support

CTL = os.path.abspath(os.environ.get("SHMBROKERCTL")
                      or os.path.join(os.path.dirname(support.daemon_binary()), "shmbrokerctl"))


def ctl(*args):
    r = subprocess.run([CTL] + list(args), stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=60)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


class FromSegmentTest(unittest.TestCase):

    def setUp(self):
        self.shm = support.shm_base()
        self.addCleanup(shutil.rmtree, self.shm, True)

    def daemon(self, name=None, args=()):
        d = support.Daemon(size="1M", args=list(args), shm_dir=self.shm)
        if name is not None:
            d.name = name
        self.addCleanup(d.cleanup)
        return d.start()

    def read(self, d, *extra):
        rc, out, err = ctl("--socket", d.socket_path, "status", "--from-segment",
                           "--shm-dir", self.shm, *extra)
        self.assertEqual(rc, 0, err)
        return out

    def assert_read(self, out, d, segment):
        """out is the report of segment, written by d, found as d's."""
        path = os.path.join(self.shm, segment)
        self.assertRegex(out, r"(?m)^segment   %s: " % re.escape(path))
        self.assertIn("shmbrokerd (pid %d)" % d.proc.pid, out)
        self.assertIn("the segment of the shmbrokerd listening at %s (pid %d)"
                      % (d.socket_path, d.proc.pid), out)

    # Two daemons in one directory, one of them with the default name: each
    # socket's status reads its own daemon's segment, not the default one.
    def test_two_daemons(self):
        a = self.daemon(name="shmbroker")
        b = self.daemon()
        self.assert_read(self.read(b), b, b.name)
        self.assert_read(self.read(a), a, "shmbroker")

    # Many segments of other daemons in the directory (more than a scan
    # keeps for a message) do not hide the one of the daemon at the socket.
    def test_many_other_segments(self):
        a = self.daemon()
        b = self.daemon()
        with open(os.path.join(self.shm, a.name), "rb") as f:
            header = f.read(4096)
        for i in range(100):
            path = os.path.join(self.shm, "other-%03d" % i)
            with open(path, "wb") as f:
                f.write(header)  # a's header: owned by a, not b
            os.chmod(path, 0o600)  # as a daemon makes its segment
        self.assert_read(self.read(b), b, b.name)
        rc, out, err = ctl("--socket", a.socket_path, "status", "--from-segment",
                           "--shm-dir", self.shm)
        self.assertEqual(rc, 2, out + err)
        self.assertIn("101 segments in %s fit" % self.shm, err)
        self.assertIn("more", err)

    # Someone else planted a file in the directory with a copy of the
    # daemon's header, which names the daemon's pid as its owner: a file
    # others may read (a daemon's segment is mode 0600), or, when the test
    # may give files away, one of another user's. Status still reads the
    # daemon's own segment, not asking to choose between it and the copies.
    def test_forged_header(self):
        d = self.daemon()
        with open(os.path.join(self.shm, d.name), "rb") as f:
            header = f.read(4096)
        with open(os.path.join(self.shm, "forged-readable"), "wb") as f:
            f.write(header)
        os.chmod(os.path.join(self.shm, "forged-readable"), 0o644)
        if os.geteuid() == 0:
            path = os.path.join(self.shm, "forged-by-nobody")
            with open(path, "wb") as f:
                f.write(header)
            os.chmod(path, 0o600)
            os.chown(path, 65534, 65534)
        self.assert_read(self.read(d), d, d.name)

    # A daemon with two pools: --pool NAME reads that pool's segment, found
    # by the pool's name alone; without --pool, status names both and asks.
    def test_pools(self):
        d = self.daemon(args=["--pool", "main:2M", "--pool", "cache:2M"])
        self.assert_read(self.read(d, "--pool", "cache"), d, d.name + ".cache")
        self.assert_read(self.read(d, "--pool", "main"), d, d.name + ".main")
        rc, out, err = ctl("--socket", d.socket_path, "--pool", "main", "status",
                           "--from-segment", "--shm-dir", self.shm)
        self.assertEqual(rc, 0, err)
        self.assert_read(out, d, d.name + ".main")
        rc, out, err = ctl("--socket", d.socket_path, "status", "--from-segment",
                           "--shm-dir", self.shm)
        self.assertEqual(rc, 2, out + err)
        self.assertIn("%s.cache" % d.name, err)
        self.assertIn("%s.main" % d.name, err)
        self.assertIn("--pool NAME", err)
        rc, out, err = ctl("--socket", d.socket_path, "status", "--from-segment",
                           "--shm-dir", self.shm, "--pool", "nosuch")
        self.assertEqual(rc, 66, out + err)
        self.assertIn("no shmbroker segment of pool nosuch", err)

    # No daemon listens at the socket any more: status says that it chose by
    # name, and which segment it read.
    def test_no_listener_says_how_it_chose(self):
        d = self.daemon(name="shmbroker", args=["--keep-segment"])
        d.stop()
        rc, out, err = ctl("--socket", d.socket_path, "status", "--from-segment",
                           "--shm-dir", self.shm)
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"(?m)^segment   %s: "
                         % re.escape(os.path.join(self.shm, "shmbroker")))
        self.assertIn("by its default name: no daemon listening at %s owns a segment here"
                      % d.socket_path, out)


if __name__ == "__main__":
    unittest.main()
