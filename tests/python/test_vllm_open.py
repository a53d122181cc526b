# SPDX-License-Identifier: Apache-2.0
"""Opening a vLLM store with a private ring: spawn_daemon hears the daemon's
READY=1 on a notify socket of its own (a service manager's socket in the
environment is not told of the private daemon), and the ring's clients map
the segment without populating it, so that opening costs about what the
daemon's reserving the pages costs, not that twice more."""

import os
import socket
import tempfile
import unittest

import support  # noqa: F401  (puts the package on the path)
import shmbroker
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer

MiB = 1024 * 1024


def resident_bytes(path_part):
    """Bytes resident in this process's mappings whose name holds path_part."""
    total = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5:
                inside = len(fields) >= 6 and path_part in fields[5]
            elif inside and fields and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


class OpenTest(unittest.TestCase):
    # A private daemon started under a service manager (NOTIFY_SOCKET set
    # for the application) tells that manager nothing: its READY=1 goes to
    # spawn_daemon's own socket, which waits for it.
    def test_notify_socket_of_the_environment_untouched(self):
        workdir = tempfile.mkdtemp(prefix="shmb-notify-")
        self.addCleanup(os.rmdir, workdir)
        path = os.path.join(workdir, "manager.sock")
        manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        manager.bind(path)
        self.addCleanup(os.unlink, path)
        self.addCleanup(manager.close)
        old = os.environ.get("NOTIFY_SOCKET")
        os.environ["NOTIFY_SOCKET"] = path
        try:
            d = shmbroker.spawn_daemon("4M")
        finally:
            if old is None:
                del os.environ["NOTIFY_SOCKET"]
            else:
                os.environ["NOTIFY_SOCKET"] = old
        self.addCleanup(d.stop)
        with shmbroker.Client(d.socket_path) as c:
            c.put("k", b"v")  # it serves
        manager.setblocking(False)
        with self.assertRaises(BlockingIOError):
            manager.recv(4096)

    # Opening a 256 MiB ring maps none of its pages up front; puts and gets
    # then map those they touch.
    def test_ring_not_populated(self):
        ring = SingleWriterShmRingBuffer(256 * MiB, create=True)
        store = ShmBrokerObjectStorage(max_object_size=2 * MiB, n_readers=1, ring_buffer=ring)
        self.addCleanup(store.close)
        segment = ring.client.info["segment"]
        self.assertLess(resident_bytes(segment), 16 * MiB)
        pair = store.put("k", b"x" * MiB)
        self.assertEqual(store.get(*pair), b"x" * MiB)


if __name__ == "__main__":
    unittest.main()
