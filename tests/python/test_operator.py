# SPDX-License-Identifier: Apache-2.0
"""What an operator meets, from the Python client: a daemon that is still
reserving its pools is said to be starting (ConnectionLost EAGAIN with its
progress), not refused; the client's hello says its own pid, which the
daemon shows for a client in a pid namespace it cannot see into."""

import errno
import fcntl
import os
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import shmbroker  # noqa: E402
from support import Daemon, daemon_binary  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


def slow_reserve_lib():
    """The LD_PRELOAD that holds a reservation after its first chunk while a
    file exists (tests/e2e/slow_reserve.c), or None when not built."""
    build = os.environ.get("SHMB_BUILD_DIR") or os.path.join(ROOT, "build")
    path = os.path.abspath(os.path.join(build, "tests", "slow_reserve.so"))
    return path if os.path.exists(path) else None


class StartingTest(unittest.TestCase):

    def test_starting_is_said_with_its_progress(self):
        """Held after 256 MiB of a 512 MiB pool, the daemon refuses no
        connect silently: Client() raises ConnectionLost with code EAGAIN,
        saying it is starting and how far; once let go, Client() works and
        the progress file is gone."""
        lib = slow_reserve_lib()
        if lib is None:
            self.skipTest("build/tests/slow_reserve.so is not built (make it)")
        d = Daemon(args=["--pool", "big:512M"])
        self.addCleanup(d.cleanup)
        gate = os.path.join(d.dir, "gate")
        open(gate, "w").close()
        env = dict(os.environ, LD_PRELOAD=lib, SHMB_TEST_RESERVE_GATE=gate)
        env["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"),
                                                     "verify_asan_link_order=0"]))
        argv = [daemon_binary(), "--socket", d.socket_path, "--name", d.name,
                "--shm-dir", d.shm_dir, "--pool", "big:512M"]
        with open(d.log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    env=env, close_fds=True)
        self.addCleanup(lambda: (proc.terminate(), proc.wait(30)))
        seen = None
        deadline = time.monotonic() + 30
        while seen is None and time.monotonic() < deadline:
            self.assertIsNone(proc.poll(), "the daemon exited while starting")
            try:
                shmbroker.Client(d.socket_path).close()
                self.fail("the daemon served while it was held")
            except shmbroker.ConnectionLost as e:
                # Its first words come before the first chunk: wait for the held one.
                if e.code == "EAGAIN" and "256 MiB of" in str(e):
                    seen = e
            time.sleep(0.02)
        self.assertIsNotNone(seen, "Client() never said the daemon was starting")
        self.assertIn("is starting", str(seen))
        self.assertIn("reserving pool 'big': 256 MiB of 512 MiB", str(seen))
        self.assertNotIn("Is shmbrokerd running", str(seen))
        self.assertTrue(os.path.exists(d.socket_path + ".starting"))
        os.unlink(gate)
        deadline = time.monotonic() + 30
        while True:
            try:
                c = shmbroker.Client(d.socket_path)
                break
            except shmbroker.ConnectionLost:
                self.assertLess(time.monotonic(), deadline, "the daemon never served")
                time.sleep(0.02)
        c.close()
        self.assertFalse(os.path.exists(d.socket_path + ".starting"))

    def test_stale_progress_is_refused(self):
        """A progress file nobody holds locked (its daemon was killed while
        it started) is not believed: the connect is refused as before."""
        d = Daemon()
        self.addCleanup(d.cleanup)
        with open(d.socket_path + ".starting", "w") as f:
            f.write("4194304\nreserving pool 'x': 1 of 2\n")
        with self.assertRaises(shmbroker.ConnectionLost) as cm:
            shmbroker.Client(d.socket_path)
        self.assertIn(cm.exception.code, ("ENOENT", "ECONNREFUSED"))


    def test_planted_progress_is_refused(self):
        """A progress file others may write (mode 0666), or, when the test
        may give files away, another user's, held locked as a starting
        daemon holds it: not believed, the connect is refused as before."""
        d = Daemon()
        self.addCleanup(d.cleanup)
        path = d.socket_path + ".starting"
        for owner in ([None, 65534] if os.geteuid() == 0 else [None]):
            with open(path, "w") as f:
                f.write("%d\nreserving pool 'x': planted\n" % os.getpid())
                f.flush()
                if owner is None:
                    os.chmod(path, 0o666)
                else:
                    os.chmod(path, 0o644)
                    os.chown(path, owner, owner)
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                with self.assertRaises(shmbroker.ConnectionLost) as cm:
                    shmbroker.Client(d.socket_path)
                self.assertNotIn("planted", str(cm.exception))
                self.assertIn(cm.exception.code, ("ENOENT", "ECONNREFUSED"))
            os.unlink(path)


class OwnPidTest(unittest.TestCase):

    def test_hello_says_own_pid(self):
        """clients() shows the pid each client's hello said (own_pid)
        beside the kernel's."""
        d = Daemon().start()
        self.addCleanup(d.cleanup)
        with shmbroker.Client(d.socket_path, name="me") as c:
            mine = [x for x in c.clients() if x["self"]]
            self.assertEqual(len(mine), 1)
            self.assertEqual(mine[0]["own_pid"], os.getpid())
            self.assertEqual(mine[0]["pid"], os.getpid())


if __name__ == "__main__":
    unittest.main()
