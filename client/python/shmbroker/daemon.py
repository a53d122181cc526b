# SPDX-License-Identifier: Apache-2.0
"""Starting a private shmbrokerd: for tests, and for programs that need a
broker of their own when no system daemon runs.

spawn_daemon() runs the shmbrokerd binary on a temporary socket, waits until
it accepts connections and returns a Daemon that stops it. This module knows
the daemon's command line, not its protocol: clients talk to it through
shmbroker.Client.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid

from .client import Client

__all__ = ["spawn_daemon", "Daemon", "find_binary", "socket_answers"]

# Where `make` leaves the binary, from this package's directory
# (client/python/shmbroker) in a source tree.
_TREE_BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                            os.pardir, "build", "shmbrokerd")
# Lines of the daemon's log quoted when it fails to start: enough for its
# error message, short enough to read.
_LOG_TAIL = 20


def find_binary(binary=None):
    """The shmbrokerd to run: binary when given, else $SHMBROKERD, else
    `shmbrokerd` on PATH, else build/shmbrokerd of the source tree this
    package sits in. FileNotFoundError naming every place looked at when
    none is there."""
    if binary:
        path = os.fspath(binary)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise FileNotFoundError("shmbrokerd binary %s is not an executable file." % path)
        return os.path.abspath(path)
    env = os.environ.get("SHMBROKERD")
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return os.path.abspath(env)
        raise FileNotFoundError("$SHMBROKERD is %s, which is not an executable file; fix it or "
                                "unset it." % env)
    found = shutil.which("shmbrokerd")
    if found:
        return found
    tree = os.path.normpath(_TREE_BINARY)
    if os.path.isfile(tree) and os.access(tree, os.X_OK):
        return tree
    raise FileNotFoundError("No shmbrokerd binary: none was passed, $SHMBROKERD is not set, "
                            "there is no shmbrokerd on PATH, and %s does not exist. Install "
                            "shmbroker (`make install`), build it (`make`), or set SHMBROKERD."
                            % tree)


def socket_answers(path):
    """Whether something accepts connections on the Unix socket at path
    (a probe: it connects and closes without saying hello)."""
    if not path or len(os.fsencode(path)) >= 108:
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(os.fspath(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _tail(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-_LOG_TAIL:])
    except OSError:
        return ""


class Daemon:
    """A shmbrokerd started by spawn_daemon(), owned by this process.

    Attributes: ``socket_path`` (pass it to shmbroker.Client), ``name`` (the
    segment's name in the shm directory), ``pid``, ``log_path`` (its log),
    ``size``, ``returncode`` (None while it runs).

    stop() ends it with SIGTERM (it removes its socket and segment) and
    waits; leaving a ``with`` block stops it too, and so does garbage
    collection of a Daemon still running, as a safety net. A child made by
    fork() never stops its parent's daemon. A process killed with SIGKILL
    takes its daemon with it (spawn_daemon's stop_with_process): the daemon
    stops cleanly once the process that started it has exited (only its
    temporary directory, with the log, stays behind then).
    """

    def __init__(self, proc, socket_path, name, log_path, size, workdir):
        self._proc = proc
        self._owner = os.getpid()
        self._workdir = workdir  # removed at stop() when spawn_daemon made it
        self.socket_path = socket_path
        self.name = name
        self.log_path = log_path
        self.size = size
        self.pid = proc.pid

    @property
    def returncode(self):
        """The daemon's exit status once it has ended, else None."""
        return self._proc.poll()

    def running(self):
        """Whether the daemon process is still alive."""
        return self._proc.poll() is None

    def log(self):
        """The daemon's log so far, as text ("" when there is none)."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except (OSError, TypeError):
            return ""

    def stop(self, timeout=10.0, *, remove_log=True):
        """Stop the daemon (SIGTERM, then SIGKILL if it has not ended within
        timeout seconds) and return its exit status. Removes the temporary
        directory spawn_daemon made for the socket and the log, unless
        remove_log is false. Does nothing in a process other than the one
        that started it (a child made by fork())."""
        if os.getpid() != self._owner:
            return None
        proc = self._proc
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if remove_log and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        return proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.stop()
        return False

    def __del__(self):
        proc = getattr(self, "_proc", None)
        if proc is not None and getattr(self, "_owner", None) == os.getpid():
            try:
                self.stop(timeout=5.0)
            except Exception:  # interpreter shutdown: nothing more to do
                pass

    def __repr__(self):
        return "<shmbroker.Daemon pid=%d %s%s>" % (
            self.pid, self.socket_path, "" if self.running() else " stopped")


def _serves(socket_path, name):
    """The daemon listening on socket_path is the one of segment name (not
    another spawned on the same path at the same time). A daemon of pools
    names its default pool's segment NAME.POOL."""
    if not socket_answers(socket_path):
        return False
    try:
        with Client(socket_path, read_only=True, populate=False,
                    name="spawn_daemon") as c:
            segment = c.info.get("segment")
            return segment == name or (c.info.get("pool") is not None and
                                       segment == "%s.%s" % (name, c.info["pool"]))
    except Exception:
        return False


def _notify_socket(workdir):
    """A datagram socket in workdir for the daemon's READY=1, or None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(os.path.join(workdir, "notify.sock"))
    except OSError:
        sock.close()
        return None
    return sock


def _wait_ready(sock, proc, deadline):
    """Wait until the daemon says READY=1 on sock, exits, or the deadline
    passes (the caller then looks at the socket it listens on)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            return
        # Looked at every 50 ms: a daemon that dies says nothing.
        sock.settimeout(min(left, 0.05))
        try:
            data = sock.recv(4096)
        except socket.timeout:
            continue
        except OSError:
            return
        if b"READY=1" in data.split(b"\n"):
            return


def spawn_daemon(size, *, binary=None, shm_dir=None, name=None, args=(), timeout=10.0,
                 socket_path=None, stop_with_process=True):
    """Start a private shmbrokerd and return a Daemon once it accepts
    connections.

    size: the segment's size, header page included, in bytes (an int) or as
    the daemon's --size takes it ("64M"). binary: see find_binary(). shm_dir:
    the daemon's --shm-dir (default /dev/shm). name: the segment's name
    (default a unique "shmbroker-py-PID-..."). args: more flags for the
    daemon (e.g. ["--max-object-size", "1M"]). timeout: seconds to wait for
    it to listen. socket_path: where it listens (default a socket in a new
    temporary directory, removed again by stop()). stop_with_process: the
    daemon stops (removing its socket and segment) when this process exits,
    however it ends, SIGKILL included (the daemon's --stop-with-pid); False
    leaves it running until stop() or a signal.

    The daemon's output goes to Daemon.log_path. Raises FileNotFoundError
    when there is no binary, RuntimeError (quoting the end of its log) when
    it exits or does not listen in time; ValueError for a bad size."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise TypeError("size is a number of bytes or a string such as \"64M\", not %s."
                        % type(size).__name__)
    if isinstance(size, int) and size <= 0:
        raise ValueError("A daemon of %d bytes: the size must be positive." % size)
    exe = find_binary(binary)
    workdir = tempfile.mkdtemp(prefix="shmbroker-")
    notify = None
    try:
        if socket_path is None:
            socket_path = os.path.join(workdir, "shmbroker.sock")
        socket_path = os.path.abspath(os.fspath(socket_path))
        if len(os.fsencode(socket_path)) >= 108:
            raise ValueError("Socket path %s is longer than a Unix socket address holds (107 "
                             "bytes)." % socket_path)
        if socket_answers(socket_path):
            raise RuntimeError("A daemon already listens on %s; connect to it, or choose "
                               "another socket path." % socket_path)
        if name is None:
            name = "shmbroker-py-%d-%s" % (os.getpid(), uuid.uuid4().hex[:12])
        log_path = os.path.join(workdir, "shmbrokerd.log")
        argv = [exe, "--size", str(size), "--socket", socket_path, "--name", name]
        if stop_with_process:
            argv += ["--stop-with-pid", str(os.getpid())]
        if shm_dir is not None:
            argv += ["--shm-dir", os.fspath(shm_dir)]
        argv += [os.fspath(a) if not isinstance(a, int) else str(a) for a in args]
        # The daemon's environment names the socket it is given: one inherited
        # from elsewhere (another daemon's, or one it cannot use) is not its.
        env = dict(os.environ, SHMBROKER_SOCKET=socket_path)
        # It says READY=1 (systemd's notify protocol) on a socket of ours
        # the moment it listens, rather than being polled; a service
        # manager's socket and watchdog in this environment are not its.
        for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(var, None)
        notify = _notify_socket(workdir)
        if notify is not None:
            env["NOTIFY_SOCKET"] = notify.getsockname()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    close_fds=True, env=env)
    except BaseException:
        if notify is not None:
            notify.close()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    daemon = Daemon(proc, socket_path, name, log_path, size, workdir)
    deadline = time.monotonic() + timeout
    if notify is not None:
        try:
            _wait_ready(notify, proc, deadline)
        finally:
            notify.close()
    pause = 0.002
    while not _serves(socket_path, name):
        if proc.poll() is not None:
            text = _tail(log_path)
            daemon.stop()
            raise RuntimeError("shmbrokerd (%s) exited with status %d before it listened on "
                               "%s:\n%s" % (exe, proc.returncode, socket_path, text))
        if time.monotonic() > deadline:
            text = _tail(log_path)
            daemon.stop()
            raise RuntimeError("shmbrokerd (%s) did not listen on %s within %.1f s; its log:\n%s"
                               % (exe, socket_path, timeout, text))
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return daemon
