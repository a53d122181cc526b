# SPDX-License-Identifier: Apache-2.0
"""The guard of a writer store of the drop-in (shmbroker.vllm): a process
that deletes the writer's objects it leaves when it dies without close()
(SIGKILL included), and how the store tells it of each object (GuardTelling,
which ShmBrokerObjectStorage inherits; the guard's pipe stays on the store
as _guard).

The guard talks to the daemon as any client does; this module knows nothing
of the store's addresses and ids, its serde or its ring beyond the ring's
socket, pool and daemon.
"""

import os
import subprocess
import sys
import threading
import time
import weakref

from .client import Client
from .errors import NotFound, ProtocolError, ShmBrokerError
from ._vllm_ring import _LIST_LIMIT

# How long close() waits for a guard told that the store closed cleanly (it
# exits on reading that; this bounds a guard stopped by a debugger).
_GUARD_WAIT_S = 5.0
# Objects a guard keeps track of before it drops those the daemon evicted.
_GUARD_PRUNE_AT = 4096
# How long the guard of a shared writer killed without close() keeps its
# objects that readers await (seconds): a live reader reads what it was
# handed within a request's time; objects no reader reads by then are
# deleted, as those of readers that never come would otherwise block every
# client's reclaim for ever. Each object read meanwhile is deleted once read.
_GUARD_GRACE_S = 60.0
_GUARD_POLL_S = (0.02, 1.0)


class GuardTelling:
    """How a writer store starts its guard, tells it of each object, and
    lets it go (see the module's help)."""

    def _tell_guard(self, what, key, offset=0, chunk_id=0):
        """Tell the guard (see _guard_main) of an object put ("P") or
        forgotten ("F")."""
        guard = self._guard
        if guard is None or guard[1] != os.getpid():
            return
        if self._write_guard(guard, [(what, key, offset, chunk_id)]):
            return
        # The guard is gone (killed): a new one, told of every object the
        # writer still has, else a writer killed later leaves them for ever.
        self._guard = None
        self._start_guard()
        guard = self._guard
        if guard is None:
            return
        lines = [("P", k, o, c) for k, (o, c) in self._objects.items()]
        if self._base_where is not None:
            lines.append(("P", self._base_key) + self._base_where)
        if what == "P" or key not in self._objects:
            lines.append((what, key, offset, chunk_id))
        if not self._write_guard(guard, lines):
            self._guard = None

    @staticmethod
    def _write_guard(guard, lines):
        """Write lines to guard's pipe; False when the guard is gone."""
        data = b"".join(("%s %d %d %s\n" % (what, offset, chunk_id,
                                            key.encode("utf-8", "surrogatepass").hex())
                         ).encode("ascii") for what, key, offset, chunk_id in lines)
        try:
            while data:
                data = data[os.write(guard[0], data):]
        except OSError:
            os.close(guard[0])
            guard[2].poll()  # reap it: it died
            return False
        return True

    def _start_guard(self):
        """On a daemon the writer did not start, a process that deletes the
        writer's objects that are left when the writer dies without close()
        (SIGKILL included): objects that await reads stay for ever otherwise,
        and the oldest of them stops every client's reclaim. A private
        daemon stops with its writer, taking everything with it."""
        if self._guard is not None or self.ring_buffer.daemon is not None:
            return
        _GUARDED.add(self)
        rfd, wfd = os.pipe()
        code = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "from shmbroker.vllm import _guard_main; _guard_main(*sys.argv[2:])")
        package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        try:
            proc = subprocess.Popen([sys.executable, "-c", code, package_dir,
                                     self.ring_buffer.socket_path, self.ring_buffer.pool or "",
                                     "keep-awaited" if self._guard_keeps_awaited else "",
                                     repr(float(_GUARD_GRACE_S))],
                                    stdin=rfd, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, close_fds=True,
                                    start_new_session=True)
        except OSError:
            os.close(wfd)
            return  # no guard: close() still deletes the objects
        finally:
            os.close(rfd)
        self._guard = (wfd, os.getpid(), proc)

    def _stop_guard(self, clean):
        """Let the guard go: with clean, the store deleted its objects itself
        and the guard deletes nothing; else the guard deletes them."""
        guard, self._guard = self._guard, None
        if guard is not None and guard[1] == os.getpid():
            try:
                if clean:
                    os.write(guard[0], b"C 0 0 00\n")
            except OSError:
                pass
            os.close(guard[0])
            # It leaves at once, or once it has deleted what the store left
            # (a shared store's guard waits for readers, up to its grace):
            # reap it, so that no zombie stays while the writer runs on,
            # without holding close() up for the grace.
            wait = _GUARD_WAIT_S if clean or not self._guard_keeps_awaited else 0.2
            try:
                guard[2].wait(wait)
            except subprocess.TimeoutExpired:
                threading.Thread(target=guard[2].wait, name="shmbroker-guard-reaper",
                                 daemon=True).start()


# The stores whose guard a fork()ed child must not keep: the pipe's write end
# held in a child hides the writer's death from the guard while it runs.
_GUARDED = weakref.WeakSet()


def _forget_guards_in_child():
    for store in list(_GUARDED):
        guard, store._guard = store._guard, None
        if guard is not None:
            try:
                os.close(guard[0])
            except OSError:
                pass
    _GUARDED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_guards_in_child)


def _guard_main(socket_path, pool, keep_awaited="", grace=None):
    """The guard of a writer store (ShmBrokerObjectStorage._start_guard): reads
    "P offset chunk_id key-hex" (put) and "F 0 0 key-hex" (forgotten) lines
    on stdin; "C" means the store closed cleanly. At end of input without
    "C" (the writer died), deletes each object it was told of that is still
    the writer's (same chunk at the same offset, committed), then exits;
    with keep_awaited, first those that no reader pins or awaits (a shared
    store's others may have handed them out), then each of the others once
    read, and after grace seconds (_GUARD_GRACE_S) those still awaited."""
    objects = {}
    clean = False
    client = None
    prune_at = _GUARD_PRUNE_AT
    for raw in sys.stdin.buffer:
        parts = raw.split()
        if len(parts) != 4:
            continue
        what = parts[0]
        if what == b"C":
            clean = True
            break
        try:
            key = bytes.fromhex(parts[3].decode("ascii")).decode("utf-8", "surrogatepass")
            where = (int(parts[1]), int(parts[2]))
        except ValueError:
            continue
        if what == b"P":
            objects.pop(key, None)
            objects[key] = where
        elif what == b"F":
            objects.pop(key, None)
        if len(objects) > prune_at:
            # Keep the objects that are still there: the others were evicted.
            try:
                if client is None:
                    client = Client(socket_path, name="vllm-guard", pool=pool or None)
                objects = {k: v for k, v in objects.items()
                           if _guard_owns(client, k, v)}
            except ShmBrokerError:
                pass
            # As many live again before the next look: linear work per line.
            prune_at = max(_GUARD_PRUNE_AT, 2 * len(objects))
    if clean or not objects:
        return
    grace = _GUARD_GRACE_S if grace is None else float(grace)
    deadline = time.monotonic() + grace
    pause = _GUARD_POLL_S[0]
    try:
        if client is None:
            client = Client(socket_path, name="vllm-guard", pool=pool or None)
        while objects:
            keep = keep_awaited and time.monotonic() < deadline
            for key, where in list(objects.items()):
                if not _guard_owns(client, key, where):
                    del objects[key]  # evicted, or deleted and its space reused
                elif not (keep and _awaited(client, key, where)):
                    try:
                        client.delete(key)
                    except NotFound:
                        pass
                    del objects[key]
            if objects:
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                pause = min(2 * pause, _GUARD_POLL_S[1])
    except ShmBrokerError:
        pass  # the daemon went: nothing of the writer's is left there


def _awaited(client, key, where):
    """Whether the object of key at where is pinned or awaits reads (or
    cannot be told apart among the objects its key prefixes)."""
    objects = client.list(key, _LIST_LIMIT)
    for obj in objects:
        if obj.get("key") == key and obj.get("offset") == where[0]:
            return obj.get("pins", 0) > 0 or obj.get("readers", 0) > 0
    return objects.truncated


def _guard_owns(client, key, where):
    """Whether the committed object at where (offset, chunk id) is still key's."""
    try:
        return client.object_header(where[0], committed=True) == (where[1], key)
    except ProtocolError:
        return False
