# SPDX-License-Identifier: Apache-2.0
"""Helpers of the Python tests: a real shmbrokerd on a temporary socket and
shm directory (as tests/e2e/harness.c does), stopped at the end, its log
shown when a test fails.

The binary is $SHMBROKERD, else build/shmbrokerd of the source tree.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_DIR = os.path.join(ROOT, "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import shmbroker  # noqa: E402  (after the path is set)

_count = [0]


def daemon_binary():
    """The shmbrokerd the tests run."""
    path = os.environ.get("SHMBROKERD") or os.path.join(ROOT, "build", "shmbrokerd")
    return os.path.abspath(path)


def shm_base():
    """Where the tests' segments go: a fresh directory in /dev/shm (a tmpfs),
    else in the temporary directory."""
    for base in ("/dev/shm", None):
        try:
            return tempfile.mkdtemp(prefix="shmb-py-", dir=base)
        except OSError:
            continue
    raise RuntimeError("no temporary directory for a segment")


class Daemon:
    """A shmbrokerd on a temporary socket, in a temporary shm directory.

    start() waits until it accepts connections; stop() sends SIGTERM and
    waits; kill() sends SIGKILL (the segment stays, for an adoption by the
    next start() with the same name and size). log() returns its output."""

    def __init__(self, size="1M", args=(), workdir=None, shm_dir=None):
        _count[0] += 1
        self.size = size
        self.args = list(args)
        self.own_dir = workdir is None
        self.dir = workdir or tempfile.mkdtemp(prefix="shmb-py-")
        self.own_shm_dir = shm_dir is None
        self.shm_dir = shm_dir or shm_base()
        self.name = "shmb-py-%d-%d" % (os.getpid(), _count[0])
        self.socket_path = os.path.join(self.dir, "d%d.sock" % _count[0])
        self.log_path = os.path.join(self.dir, "d%d.log" % _count[0])
        self.proc = None

    def start(self, extra=(), timeout=10.0):
        """Start (or restart) the daemon and wait for its socket."""
        argv = [daemon_binary(), "--socket", self.socket_path, "--name", self.name,
                "--size", self.size, "--shm-dir", self.shm_dir] + self.args + list(extra)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, close_fds=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("shmbrokerd exited with status %d at start:\n%s"
                                   % (self.proc.returncode, self.log()))
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket_path)
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError("shmbrokerd did not listen on %s within %.0f s:\n%s"
                                       % (self.socket_path, timeout, self.log()))
                time.sleep(0.01)
            finally:
                s.close()

    def stop(self):
        """SIGTERM and wait; returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self):
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def client(self, **kw):
        """A Client of this daemon."""
        return shmbroker.Client(self.socket_path, **kw)

    def cleanup(self):
        self.stop()
        if self.own_shm_dir:
            shutil.rmtree(self.shm_dir, ignore_errors=True)
        else:
            for name in (self.name, "." + self.name + ".lock"):
                try:
                    os.unlink(os.path.join(self.shm_dir, name))
                except OSError:
                    pass
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class DaemonTest(unittest.TestCase):
    """A test case with a fresh daemon per test (self.d) and a client of it
    (self.c); DAEMON_SIZE and DAEMON_ARGS tune it. The daemon's log is
    printed when the test fails."""

    DAEMON_SIZE = "1M"
    DAEMON_ARGS = ()

    def setUp(self):
        self.d = Daemon(self.DAEMON_SIZE, self.DAEMON_ARGS).start()
        self.addCleanup(self._teardown_daemon)
        self.c = self.d.client(name="test")
        self.addCleanup(self.c.close)

    def _teardown_daemon(self):
        outcome = getattr(self, "_outcome", None)
        failed = False
        if outcome is not None:
            result = getattr(outcome, "result", None)
            errors = getattr(outcome, "errors", None) or []
            failed = any(exc is not None for _, exc in errors)
            if result is not None and not failed:
                failed = any(t is self for t, _ in result.failures + result.errors)
        self.d.cleanup()
        if failed:
            sys.stdout.write("---- log of shmbrokerd --name %s:\n%s" % (self.d.name, self.d.log()))

    def stats(self, client=None):
        return (client or self.c).stats()


class FakeServer:
    """One connection on a socket in a temporary directory (``.path``),
    served by the subclass's serve() in a thread once start() is called;
    closed and removed when the test ends. ``.dir`` holds its other files."""

    def __init__(self, test, prefix="shmb-fake-"):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.path = os.path.join(self.dir, "fake.sock")
        self.seen = []
        self.thread = None
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)
        test.addCleanup(self.cleanup)

    def start(self):
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        raise NotImplementedError

    def cleanup(self):
        self.listener.close()
        if self.thread is not None:
            self.thread.join(5)
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def child_python(code, *args, env=None):
    """Run code in a new python3 with the package on its path; returns the
    Popen (stdout piped)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = PACKAGE_DIR + os.pathsep + e.get("PYTHONPATH", "")
    if env:
        e.update(env)
    return subprocess.Popen([sys.executable, "-c", code] + list(args), env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE)
