# SPDX-License-Identifier: Apache-2.0
"""A user without root: the daemon's default socket, where the clients look
for it, and what a client is told when the socket refuses it (EACCES).

The daemon and its clients run as uid 65534 (nobody) through setpriv, so
these tests need root to start them; the daemon of the EACCES test is
root's own."""

import grp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import support


NOBODY = 65534
AS_NOBODY = ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups"]
BUILD = os.path.dirname(support.daemon_binary())
CTL = os.path.abspath(os.environ.get("SHMBROKERCTL") or os.path.join(BUILD, "shmbrokerctl"))
EXAMPLE = os.path.join(BUILD, "example")
TMP_DIR = "/tmp/shmbroker-%d" % NOBODY

# A Python client with no socket path: put, get back, say where it went.
PY_CLIENT = """
import shmbroker
c = shmbroker.Client()
c.put("user-socket-py", b"from python")
got = c.read("user-socket-py")
assert got == b"from python", got
c.delete("user-socket-py")
print(c.socket_path)
"""


def _nobody_reaches_the_tree():
    """Whether uid 65534 can run the binaries and import the package (a tree
    under a home directory of mode 0700 is closed to it)."""
    try:
        r = subprocess.run(AS_NOBODY + ["sh", "-c", 'test -x "$1" && test -x "$2" && test -x '
                                        '"$3" && test -r "$4"', "sh",
                                        support.daemon_binary(), CTL, EXAMPLE,
                                        os.path.join(support.PACKAGE_DIR, "shmbroker",
                                                     "__init__.py")],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except OSError:
        return False
    return r.returncode == 0


def needs_root(test):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return unittest.skip("needs root and setpriv to run as uid %d" % NOBODY)(test)
    if not _nobody_reaches_the_tree():
        return unittest.skip("uid %d cannot reach the build or the package (a parent "
                             "directory closed to others)" % NOBODY)(test)
    return test


def nobody_env(xdg):
    """The environment of a user session without $SHMBROKER_SOCKET; with
    xdg as $XDG_RUNTIME_DIR, or none."""
    env = dict(os.environ)
    env.pop("SHMBROKER_SOCKET", None)
    env.pop("XDG_RUNTIME_DIR", None)
    if xdg is not None:
        env["XDG_RUNTIME_DIR"] = xdg
    env["PYTHONPATH"] = support.PACKAGE_DIR
    env["HOME"] = "/"
    return env


def run_as_nobody(argv, env, timeout=30):
    return subprocess.run(AS_NOBODY + argv, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=timeout)


def live_socket(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


@needs_root
class UserSocketTest(unittest.TestCase):
    """shmbrokerd started by uid 65534 with no --socket."""

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="shmb-user-")
        os.chmod(self.work, 0o755)
        self.shm_base = support.shm_base()
        os.chmod(self.shm_base, 0o755)
        self.shm = tempfile.mkdtemp(prefix="shmb-user-", dir=self.shm_base)
        os.chown(self.shm, NOBODY, NOBODY)
        self.proc = None
        self.log_path = os.path.join(self.work, "d.log")

    def tearDown(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.shm_base, ignore_errors=True)

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def start(self, env, expect_socket):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                AS_NOBODY + [support.daemon_binary(), "--name", "user-sock-%d" % os.getpid(),
                             "--size", "4M", "--shm-dir", self.shm],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while not live_socket(expect_socket):
            if self.proc.poll() is not None:
                self.fail("shmbrokerd exited with %d:\n%s" % (self.proc.returncode, self.log()))
            if time.monotonic() > deadline:
                self.fail("no daemon at %s within 30 s:\n%s" % (expect_socket, self.log()))
            time.sleep(0.02)

    def check_clients_find(self, env, expect_socket):
        """ctl status, the C example and a Python client, all without a
        socket path, reach the daemon at expect_socket."""
        r = run_as_nobody([CTL, "status"], env)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        self.assertIn(expect_socket, r.stdout.decode(errors="replace"))
        r = run_as_nobody([EXAMPLE], env)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        self.assertEqual(r.stdout, b"hello, shared memory\n")
        r = run_as_nobody([sys.executable, "-c", PY_CLIENT], env)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        self.assertEqual(r.stdout.decode().strip(), expect_socket)

    # With $XDG_RUNTIME_DIR, the socket goes under it, the log says so, and
    # every client of that user finds it there.
    def test_xdg_runtime_dir(self):
        xdg = os.path.join(self.work, "run-user")
        os.mkdir(xdg, 0o700)
        os.chown(xdg, NOBODY, NOBODY)
        path = os.path.join(xdg, "shmbroker", "shmbroker.sock")
        env = nobody_env(xdg)
        self.start(env, path)
        self.assertIn("the socket is %s" % path, self.log())
        st = os.lstat(os.path.dirname(path))
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (NOBODY, 0o700))
        self.check_clients_find(env, path)

    # Without $XDG_RUNTIME_DIR, a directory of its own in /tmp, mode 0700.
    def test_tmp_private_dir(self):
        if os.path.lexists(TMP_DIR) and live_socket(os.path.join(TMP_DIR, "shmbroker.sock")):
            self.skipTest("a daemon of uid %d already listens in %s" % (NOBODY, TMP_DIR))
        shutil.rmtree(TMP_DIR, ignore_errors=True)
        self.addCleanup(shutil.rmtree, TMP_DIR, True)
        path = os.path.join(TMP_DIR, "shmbroker.sock")
        env = nobody_env(None)
        self.start(env, path)
        self.assertIn("the socket is %s" % path, self.log())
        st = os.lstat(TMP_DIR)
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (NOBODY, 0o700))
        self.check_clients_find(env, path)

    # A /tmp/shmbroker-UID that someone else made first is not used: the
    # daemon refuses to start there, saying whose it is, and a client does
    # not take a socket in it for its user's own.
    def test_tmp_dir_of_another_user(self):
        if os.path.lexists(TMP_DIR) and live_socket(os.path.join(TMP_DIR, "shmbroker.sock")):
            self.skipTest("a daemon of uid %d already listens in %s" % (NOBODY, TMP_DIR))
        shutil.rmtree(TMP_DIR, ignore_errors=True)
        self.addCleanup(shutil.rmtree, TMP_DIR, True)
        os.mkdir(TMP_DIR, 0o755)  # root's
        env = nobody_env(None)
        with open(self.log_path, "ab") as log:
            r = subprocess.run(
                AS_NOBODY + [support.daemon_binary(), "--name", "user-sock-%d" % os.getpid(),
                             "--size", "4M", "--shm-dir", self.shm],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("%s is not a private directory of this user's (uid %d): it is a "
                      "directory of uid 0 with mode 0755" % (TMP_DIR, NOBODY), self.log())
        # A socket planted there by root is not the user's own daemon.
        planted = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(planted.close)
        planted.bind(os.path.join(TMP_DIR, "shmbroker.sock"))
        r = run_as_nobody([sys.executable, "-c",
                           "from shmbroker import client; print(client.default_socket_path())"],
                          env)
        self.assertEqual(r.stdout.decode().strip(), "/run/shmbroker/shmbroker.sock",
                         r.stderr.decode(errors="replace"))

    # A user's daemon beside root's (the system's) of the same --name in the
    # same directory: it cannot open root's segment, and is told that it is
    # another user's and to choose a name of its own, never to remove it.
    def test_segment_of_another_user(self):
        os.chmod(self.shm, 0o1777)
        name = "user-sock-%d" % os.getpid()
        root_sock = os.path.join(self.work, "root.sock")
        root = subprocess.Popen([support.daemon_binary(), "--name", name, "--size", "4M",
                                 "--shm-dir", self.shm, "--socket", root_sock],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        self.addCleanup(root.wait, 20)
        self.addCleanup(root.terminate)
        deadline = time.monotonic() + 30
        while not live_socket(root_sock):
            self.assertIsNone(root.poll(), "root's shmbrokerd exited")
            self.assertLess(time.monotonic(), deadline, "root's shmbrokerd did not start")
            time.sleep(0.02)
        r = run_as_nobody([support.daemon_binary(), "--name", name, "--size", "4M",
                           "--shm-dir", self.shm, "--socket",
                           os.path.join(self.work, "user.sock")], nobody_env(None))
        err = r.stderr.decode(errors="replace")
        self.assertNotEqual(r.returncode, 0, err)
        self.assertIn("%s/%s belongs to uid 0, not to this user (uid %d)" % (self.shm, name,
                                                                             NOBODY), err)
        self.assertIn("--name %s-%d" % (name, NOBODY), err)
        self.assertNotIn("remove it", err)
        self.assertTrue(os.path.exists(os.path.join(self.shm, name)))
        self.assertTrue(live_socket(root_sock))


@needs_root
class AccessDeniedTest(unittest.TestCase):
    """uid 65534 against root's daemon and its socket of mode 0660."""

    def setUp(self):
        self.d = support.Daemon(size="1M")
        os.chmod(self.d.dir, 0o755)
        self.d.start()
        self.addCleanup(self.d.cleanup)

    # ctl (the C library) and the Python client name the socket's owner,
    # group and mode and the flags that let the user in; none of them asks
    # whether the daemon runs.
    def test_eacces_message(self):
        path = self.d.socket_path
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o660)
        want = ("Permission denied connecting to shmbrokerd at %s: the socket belongs to "
                "user root (uid 0) and group root (gid 0) with mode 0660, and this process "
                "runs as uid %d, gid %d" % (path, NOBODY, NOBODY))
        env = nobody_env(None)
        r = run_as_nobody([CTL, "--socket", path, "status"], env)
        err = r.stderr.decode(errors="replace")
        self.assertEqual(r.returncode, 69, err)
        for part in (want, "usermod -aG root", "--socket-mode", "--allow-gid"):
            self.assertIn(part, err)
        self.assertNotIn("Is shmbrokerd running", err)
        code = ("import shmbroker, sys\n"
                "try:\n"
                "    shmbroker.Client(sys.argv[1])\n"
                "except shmbroker.PermissionDenied as e:\n"
                "    print(e.code); print(e)\n")
        r = run_as_nobody([sys.executable, "-c", code, path], env)
        out = r.stdout.decode(errors="replace")
        self.assertTrue(out.startswith("EACCES\n"), out + r.stderr.decode(errors="replace"))
        for part in (want, "usermod -aG root", "--socket-mode", "--allow-gid"):
            self.assertIn(part, out)
        self.assertNotIn("Is shmbrokerd running", out)

    # A socket whose group has no name here (another container's gid):
    # the command offered joins it by number, not "usermod -aG ?", which
    # fails as typed.
    def test_eacces_group_without_name(self):
        gid = 54321
        while True:
            try:
                grp.getgrgid(gid)
                gid += 1
            except KeyError:
                break
        path = self.d.socket_path
        os.chown(path, 0, gid)
        env = nobody_env(None)
        r = run_as_nobody([CTL, "--socket", path, "status"], env)
        err = r.stderr.decode(errors="replace")
        self.assertEqual(r.returncode, 69, err)
        self.assertIn("group ? (gid %d)" % gid, err)
        self.assertIn("usermod -aG %d USER" % gid, err)
        code = ("import shmbroker, sys\n"
                "try:\n"
                "    shmbroker.Client(sys.argv[1])\n"
                "except shmbroker.PermissionDenied as e:\n"
                "    print(e)\n")
        r = run_as_nobody([sys.executable, "-c", code, path], env)
        out = r.stdout.decode(errors="replace")
        self.assertIn("usermod -aG %d USER" % gid, out, r.stderr.decode(errors="replace"))


if __name__ == "__main__":
    unittest.main()
