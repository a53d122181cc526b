# SPDX-License-Identifier: Apache-2.0
"""shmbroker.spawn_daemon: a private shmbrokerd started, found and stopped."""

import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import shmbroker  # noqa: E402
from shmbroker import daemon as daemon_mod  # noqa: E402


def process_alive(pid):
    """pid runs (a zombie, exited but not yet reaped by its new parent, does
    not)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class SpawnTest(unittest.TestCase):

    def spawn(self, size="1M", **kw):
        d = shmbroker.spawn_daemon(size, **kw)
        self.addCleanup(d.stop)
        return d

    # It listens when spawn_daemon returns, serves clients, and stop() ends it
    # cleanly (status 0), removing its socket and its temporary directory.
    def test_spawn_serve_stop(self):
        d = self.spawn()
        self.assertTrue(d.running())
        with shmbroker.Client(d.socket_path) as c:
            c.put("k", b"v")
            self.assertEqual(c.read("k"), b"v")
            self.assertEqual(c.stats()["pid"], d.pid)
            self.assertEqual(c.info["segment"], d.name)
        self.assertIn("ready", d.log())
        workdir = os.path.dirname(d.socket_path)
        self.assertEqual(d.stop(), 0)
        self.assertFalse(d.running())
        self.assertFalse(os.path.exists(d.socket_path))
        self.assertFalse(os.path.exists(workdir))
        self.assertEqual(d.stop(), 0)  # a second stop is harmless

    # The size, the shm directory, the name, a socket path and extra flags
    # reach the daemon.
    def test_arguments_reach_the_daemon(self):
        shm = tempfile.mkdtemp(prefix="shmb-spawn-", dir="/dev/shm" if os.path.isdir(
            "/dev/shm") else None)
        self.addCleanup(shutil.rmtree, shm, True)
        sock = os.path.join(shm, "my.sock")
        d = self.spawn(300 * 1024 + 1, shm_dir=shm, name="spawn-test-seg", socket_path=sock,
                       args=["--max-object-size", "64K"])
        self.assertEqual(d.socket_path, sock)
        self.assertTrue(os.path.exists(os.path.join(shm, "spawn-test-seg")))
        with shmbroker.Client(sock) as c:
            self.assertEqual(c.info["size"], 304 * 1024)  # rounded up to pages
            self.assertEqual(c.info["max_object_size"], 64 * 1024)
            self.assertEqual(c.stats()["shm_dir"], shm)
        d.stop()
        self.assertFalse(os.path.exists(os.path.join(shm, "spawn-test-seg")))

    # As a context manager it stops the daemon at the end of the block.
    def test_context_manager(self):
        with shmbroker.spawn_daemon("1M") as d:
            self.assertTrue(daemon_mod.socket_answers(d.socket_path))
        self.assertFalse(d.running())

    # A Daemon dropped while running is stopped by the garbage collector.
    def test_collected_daemon_stops(self):
        d = shmbroker.spawn_daemon("1M")
        path = d.socket_path
        proc = d._proc
        del d
        gc.collect()
        self.assertIsNotNone(proc.poll())
        self.assertFalse(os.path.exists(path))

    # A child made by fork() cannot stop its parent's daemon.
    def test_forked_child_does_not_stop_it(self):
        d = self.spawn()
        pid = os.fork()
        if pid == 0:
            try:
                d.stop()
                del d
                gc.collect()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        self.assertTrue(d.running())
        self.assertTrue(daemon_mod.socket_answers(d.socket_path))

    # The process that spawned a daemon is killed with SIGKILL: the daemon
    # stops by itself (--stop-with-pid), removing its socket and segment.
    # With stop_with_process=False it stays.
    def test_owner_killed_takes_the_daemon(self):
        for keep in (False, True):
            code = ("import sys, time, shmbroker\n"
                    "d = shmbroker.spawn_daemon('1M', stop_with_process=%r)\n"
                    "print(d.pid, d.socket_path, d.name, flush=True)\n"
                    "time.sleep(60)\n" % (not keep))
            env = dict(os.environ, PYTHONPATH=PACKAGE_DIR)
            owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                     env=env, text=True)
            try:
                pid, sock, name = owner.stdout.readline().split()
                pid = int(pid)
                self.assertTrue(daemon_mod.socket_answers(sock))
            finally:
                owner.kill()
                owner.wait()
                owner.stdout.close()
            if keep:
                time.sleep(0.3)
                self.assertTrue(daemon_mod.socket_answers(sock))
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertFalse(process_alive(pid), "daemon %d still runs" % pid)
            self.assertFalse(os.path.exists(sock))
            self.assertFalse(os.path.exists(os.path.join("/dev/shm", name)))
            shutil.rmtree(os.path.dirname(sock), ignore_errors=True)

    # A daemon that fails to start is reported with its own words.
    def test_start_failure_quotes_the_log(self):
        with self.assertRaises(RuntimeError) as cm:
            shmbroker.spawn_daemon("1M", args=["--max-object-size", "2M"])
        self.assertIn("exited with status", str(cm.exception))
        self.assertIn("does not fit in the data area", str(cm.exception))

    # A socket where a daemon already listens is refused, that daemon untouched.
    def test_live_socket_refused(self):
        d = self.spawn()
        with self.assertRaises(RuntimeError) as cm:
            shmbroker.spawn_daemon("1M", socket_path=d.socket_path)
        self.assertIn("already listens", str(cm.exception))
        with shmbroker.Client(d.socket_path) as c:
            self.assertEqual(c.stats()["pid"], d.pid)

    # A $SHMBROKER_SOCKET the daemon cannot use (inherited from elsewhere,
    # longer than a socket address holds) does not keep spawn_daemon from
    # starting a daemon on its own socket, which the daemon is given: it
    # took the variable's value for its default socket first and refused.
    def test_unusable_socket_variable_is_not_the_daemons(self):
        with mock.patch.dict(os.environ, {"SHMBROKER_SOCKET": "/tmp/" + "x" * 200}):
            d = self.spawn()
        with shmbroker.Client(d.socket_path) as c:
            self.assertEqual(c.stats()["pid"], d.pid)

    # Bad sizes are refused before anything runs.
    def test_bad_size(self):
        with self.assertRaises(ValueError):
            shmbroker.spawn_daemon(0)
        with self.assertRaises(TypeError):
            shmbroker.spawn_daemon(1.5)


class BinaryTest(unittest.TestCase):
    """Which binary spawn_daemon runs."""

    def setUp(self):
        self.binary = daemon_mod.find_binary()  # the one the other tests run

    # An explicit binary wins; one that is not executable is refused.
    def test_explicit_binary(self):
        self.assertEqual(daemon_mod.find_binary(self.binary), os.path.abspath(self.binary))
        with self.assertRaises(FileNotFoundError) as cm:
            daemon_mod.find_binary("/nonexistent/shmbrokerd")
        self.assertIn("/nonexistent/shmbrokerd", str(cm.exception))

    # $SHMBROKERD comes next; a wrong one is an error rather than skipped.
    def test_env_binary(self):
        with mock.patch.dict(os.environ, {"SHMBROKERD": self.binary}):
            self.assertEqual(daemon_mod.find_binary(), os.path.abspath(self.binary))
        with mock.patch.dict(os.environ, {"SHMBROKERD": "/nonexistent/d"}):
            with self.assertRaises(FileNotFoundError) as cm:
                daemon_mod.find_binary()
            self.assertIn("$SHMBROKERD is /nonexistent/d", str(cm.exception))

    # Then PATH, then the source tree's build/shmbrokerd.
    def test_path_then_tree(self):
        bindir = tempfile.mkdtemp(prefix="shmb-bin-")
        self.addCleanup(shutil.rmtree, bindir, True)
        os.symlink(os.path.abspath(self.binary), os.path.join(bindir, "shmbrokerd"))
        env = {k: v for k, v in os.environ.items() if k != "SHMBROKERD"}
        env["PATH"] = bindir
        with mock.patch.dict(os.environ, env, clear=True):
            self.assertEqual(daemon_mod.find_binary(), os.path.join(bindir, "shmbrokerd"))
            env["PATH"] = "/nonexistent"
            with mock.patch.dict(os.environ, env, clear=True), \
                    mock.patch.object(daemon_mod, "_TREE_BINARY", self.binary):
                self.assertEqual(daemon_mod.find_binary(), os.path.normpath(self.binary))

    # When there is none, the error names every place looked at.
    def test_no_binary(self):
        env = {k: v for k, v in os.environ.items() if k != "SHMBROKERD"}
        env["PATH"] = "/nonexistent"
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch.object(daemon_mod, "_TREE_BINARY", "/nonexistent/build/shmbrokerd"):
            with self.assertRaises(FileNotFoundError) as cm:
                shmbroker.spawn_daemon("1M")
        text = str(cm.exception)
        for place in ("$SHMBROKERD", "PATH", "/nonexistent/build/shmbrokerd"):
            self.assertIn(place, text)


class SocketAnswersTest(unittest.TestCase):

    # socket_answers is true only where something accepts connections.
    def test_probe(self):
        tmp = tempfile.mkdtemp(prefix="shmb-probe-")
        self.addCleanup(shutil.rmtree, tmp, True)
        path = os.path.join(tmp, "s")
        self.assertFalse(daemon_mod.socket_answers(path))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(s.close)
        s.bind(path)
        self.assertFalse(daemon_mod.socket_answers(path))  # bound, not listening
        s.listen(1)
        self.assertTrue(daemon_mod.socket_answers(path))
        self.assertFalse(daemon_mod.socket_answers(""))
        self.assertFalse(daemon_mod.socket_answers("/" + "x" * 200))


if __name__ == "__main__":
    unittest.main()
