# SPDX-License-Identifier: Apache-2.0
"""The Python client and pools: Client(pool=...) names the pool at hello and
again at every reconnect, info and stats say which pool, the vLLM drop-in
passes pool= on; against a fake daemon (what is sent) and a real daemon of
two pools (what it means)."""

import json
import os
import shutil
import socket
import tempfile
import threading
import unittest
from unittest import mock

import support  # noqa: F401  (puts the package on the path)
from support import Daemon, DaemonTest

import shmbroker  # noqa: E402
from shmbroker import _protocol as P  # noqa: E402
from shmbroker.vllm import SingleWriterShmRingBuffer  # noqa: E402


class PoolFake:
    """A server that answers each of `dials` connections' hello (with a
    descriptor of a fake segment, and "pool"/"backing" when given) and keeps
    every hello it received in .hellos."""

    def __init__(self, test, dials=1, pool=None, backing=None):
        self.dir = tempfile.mkdtemp(prefix="shmb-fake-pool-")
        self.path = os.path.join(self.dir, "fake.sock")
        self.seg = os.path.join(self.dir, "seg")
        with open(self.seg, "wb") as f:
            head = P.SEGMENT_HEADER.pack(P.SEGMENT_MAGIC, P.LAYOUT_VERSION, 4096, 8192, 4096,
                                         4096, *[0] * (len(P.SEGMENT_HEADER_FIELDS) - 6))
            f.write(head + bytes(8192 - len(head)))
        self.extra = {}
        if pool is not None:
            self.extra = {"pool": pool, "backing": backing}
        self.dials = dials
        self.hellos = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(dials)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()
        test.addCleanup(self.cleanup)

    def serve(self):
        for _ in range(self.dials):
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                f = conn.makefile("rb")
                hello = json.loads(f.readline())
                self.hellos.append(hello)
                reply = dict({"ok": True, "version": 1, "segment": "fake", "size": 8192,
                              "data_offset": 4096, "data_size": 4096, "max_object_size": 4096,
                              "alignment": 64, "mode": "rw", "id": hello["id"]}, **self.extra)
                fd = os.open(self.seg, os.O_RDWR)
                socket.send_fds(conn, [(json.dumps(reply) + "\n").encode()], [fd])
                os.close(fd)
                f.read()

    def cleanup(self):
        self.listener.close()
        self.thread.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)


class TestPoolWire(unittest.TestCase):
    # hello names the pool given, info has the pool and backing the daemon
    # answered, and reconnect() names the same pool again.
    def test_hello_and_reconnect_name_the_pool(self):
        fake = PoolFake(self, dials=2, pool="frames", backing="memfd")
        c = shmbroker.Client(fake.path, pool="frames", populate=False)
        self.addCleanup(c.close)
        self.assertEqual(c.info["pool"], "frames")
        self.assertEqual(c.info["backing"], "memfd")
        c.reconnect()
        self.assertEqual([h.get("pool") for h in fake.hellos], ["frames", "frames"])
        self.assertEqual(c.info["pool"], "frames")

    # Without pool= (or with ""), hello names none: a daemon without pools
    # takes it as before.
    def test_default_pool_is_not_named(self):
        fake = PoolFake(self, dials=2)
        for pool in (None, ""):
            c = shmbroker.Client(fake.path, pool=pool, populate=False)
            c.close()
        fake.thread.join(5)
        self.assertEqual(len(fake.hellos), 2)
        for hello in fake.hellos:
            self.assertNotIn("pool", hello)

    # A name longer than 32 bytes is refused before anything is dialled (the
    # socket does not exist: dialling would raise ConnectionLost); 32 go out.
    def test_pool_name_length(self):
        with self.assertRaises(shmbroker.errors.InvalidRequest) as cm:
            shmbroker.Client("/nonexistent/shmb.sock", pool="p" * 33)
        self.assertEqual(cm.exception.code, "EINVAL")
        self.assertIn("32", str(cm.exception))
        with self.assertRaises(TypeError):
            shmbroker.Client("/nonexistent/shmb.sock", pool=b"frames")
        fake = PoolFake(self)
        c = shmbroker.Client(fake.path, pool="p" * 32, populate=False)
        c.close()
        fake.thread.join(5)
        self.assertEqual(fake.hellos[0]["pool"], "p" * 32)


class TestPools(DaemonTest):
    """A real daemon of two pools, alpha (the default) and beta."""

    DAEMON_ARGS = ("--pool", "alpha:1M", "--pool", "beta:2M")

    # A client of beta is in beta: its info and stats say so, its keys are
    # not alpha's, clients() shows each connection's pool, and stats()
    # lists both pools in order.
    def test_pool_client(self):
        beta = self.d.client(name="b", pool="beta")
        self.addCleanup(beta.close)
        self.assertEqual(beta.info["pool"], "beta")
        self.assertEqual(beta.info["backing"], "shm")
        self.assertEqual(self.c.info["pool"], "alpha")
        self.assertEqual(beta.info["size"], 2 << 20)
        beta.put("k", b"in beta")
        self.assertTrue(beta.contains("k"))
        self.assertFalse(self.c.contains("k"))
        st = beta.stats()
        self.assertEqual(st["pool"], "beta")
        self.assertEqual(st["objects"], 1)
        self.assertEqual([p["pool"] for p in st["pools"]], ["alpha", "beta"])
        self.assertEqual([p["objects"] for p in st["pools"]], [0, 1])
        pools = {cl["name"]: cl["pool"] for cl in beta.clients()}
        self.assertEqual(pools["b"], "beta")
        self.assertEqual(pools["test"], "alpha")

    # reconnect() goes back to the same pool: the key written there before
    # is still seen.
    def test_reconnect_keeps_the_pool(self):
        beta = self.d.client(pool="beta")
        self.addCleanup(beta.close)
        beta.put("kept", b"x")
        beta.reconnect()
        self.assertEqual(beta.info["pool"], "beta")
        self.assertTrue(beta.contains("kept"))

    # A pool the daemon does not have is refused with NotFound, the message
    # listing the pools it has.
    def test_unknown_pool(self):
        with self.assertRaises(shmbroker.errors.NotFound) as cm:
            self.d.client(pool="gamma")
        self.assertIn("alpha", str(cm.exception))
        self.assertIn("beta", str(cm.exception))


class TestVllmPool(unittest.TestCase):
    """The vLLM drop-in's ring passes pool= to its Client and its handle."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="shmb-vllm-pool-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        env = mock.patch.dict(os.environ,
                              {"SHMBROKER_SOCKET": os.path.join(self.tmp, "none.sock")})
        env.start()
        self.addCleanup(env.stop)

    # On a shared daemon, the writer's and a reader's (from handle()) clients
    # are in the pool named.
    def test_ring_on_a_daemon_of_pools(self):
        d = Daemon("1M", ("--pool", "alpha:1M", "--pool", "beta:2M")).start()
        self.addCleanup(d.cleanup)
        ring = SingleWriterShmRingBuffer(64 * 1024, create=True, socket_path=d.socket_path,
                                         pool="beta")
        self.addCleanup(ring.close)
        self.assertEqual(ring.client.info["pool"], "beta")
        handle = ring.handle()
        self.assertEqual(handle[4], "beta")
        reader = SingleWriterShmRingBuffer(*handle)
        self.addCleanup(reader.close)
        self.assertEqual(reader.client.info["pool"], "beta")
        # Readers map read-write by default, to count their reads in the
        # chunks' seals (docs/vllm.md); asked to, they stay read-only.
        self.assertFalse(reader.client.read_only)
        ro = SingleWriterShmRingBuffer(*handle, read_only=True)
        self.addCleanup(ro.close)
        self.assertEqual(ro.client.info["pool"], "beta")
        self.assertTrue(ro.client.read_only)

    # A writer that starts its private daemon starts it with the pool named,
    # so that its clients' hello finds it.
    def test_private_daemon_has_the_pool(self):
        ring = SingleWriterShmRingBuffer(64 * 1024, create=True, pool="frames")
        self.addCleanup(ring.close)
        self.assertIsNotNone(ring.daemon)
        self.assertEqual(ring.client.info["pool"], "frames")
        self.assertGreaterEqual(ring.client.info["data_size"], 64 * 1024)


if __name__ == "__main__":
    unittest.main()
